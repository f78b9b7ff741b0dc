"""The gate's comparison loop: one gated workload timed in both arms, interleaved round by round,
judged by a paired statistical test (gate/stats.py), Holm-corrected across the run's benchmarks.

    result = compare("test_step[ddp-2]", spec, {"baseline": arm_a, "candidate": arm_b}, Settings(), family_size=7)
    judge(results, settings)                 # fills verdict and level of every result

Each arm is one long-lived worker process (gate/arm.py), or `workers` of them, importing the code
under test from its own tree and the candidate's harness, so the same benchmark code times both
trees. Two identical workers differ by a bias of their own (the process's memory layout and the
like: an sd of 1-1.6 % from one pair of processes to the next here, docs/perf.md) that no number
of rounds removes; with `workers` > 1 the rounds go to the arms' worker pairs in turn, two rounds
each (round_pair, round_order), so the pairs' biases average out.
One arm works at a time while timing. Per benchmark: every worker of both arms sets up at once and
warms up (untimed), then rounds alternate the order (A B, B A, A B, ...; with several workers an
arm, round_order's A B, B A, B A, A B, ...), each round one sample per arm (the
median of a few operations, about `sample_s` seconds). A smoke run (`--benchmark-disable`: three
rounds of one operation, judged by nothing) takes each round's samples in both arms at once. From
`min_rounds` on, every `look_every` rounds the interval is checked at the strictest Holm level, and
the benchmark stops early only when it is settled (stats.settled: inside half the threshold, or
faster); otherwise it runs to `max_rounds`, where `slower` is tested once.

A worker that crashes, a workload that fails or computes a wrong result in either arm raises
ArmError: never "unchanged". A workload the baseline cannot even set up (an API the change added, a
model file it lacks) is `not comparable`, with the reason.
"""


from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.arm import Arm, ArmError

__all__ = ["Settings", "round_order", "round_pair", "Comparison", "compare", "judge", "ArmError"]


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.10   # the slowdown the gate exists to catch (fraction)
    alpha: float = 0.05       # chance of any false `slower` in a whole run (Holm across benchmarks)
    min_rounds: int = 10
    max_rounds: int = 40
    look_every: int = 5       # rounds between looks at the interval, once min_rounds are in
    warmup: int = 2           # untimed samples per arm before the rounds
    sample_s: float = 0.25    # target duration of one sample (a whole number of operations)
    workers: int = 1          # worker processes per arm; the rounds rotate through their pairs
    strict: bool = False      # `inconclusive` fails the run too
    smoke: bool = False       # --benchmark-disable: exercise the machinery, judge nothing


def workers_for(threshold: float) -> int:
    """Worker processes an arm when none is asked for: 2 below a 10 % threshold, else 1. Below 10 %
    the T/2 margin comes near the bias of one pair of processes (docs/perf.md: at T = 5 % one worker
    an arm caught 18/20 slowdowns of 5 %, two caught 20/20); at 10 % one pair is enough (20/20)."""
    return 2 if threshold < 0.10 else 1


def round_order(i: int, workers: int = 1) -> tuple[str, str]:
    """Arms of round i (from 0): A B, B A, A B, ... so neither arm always runs first, and each arm
    runs twice in a row as often as the other (B B, then A A, ...). That matters: a worker timed
    right after its own previous sample is about 1 % faster here (caches still warm: the rounds'
    log ratios were 1.7-2.5 points apart between rounds where the baseline had gone twice and
    rounds where the candidate had, docs/perf.md).

    With several worker pairs (round_pair), each pair's two rounds are A B, B A on even turns and
    B A, A B on odd ones: A0 B0 B0 A0 | B1 A1 A1 B1 | ... A plain A B, B A for every pair would put
    the pairs' changes at A0 | A1, so only the candidate would ever run twice in a row (measured:
    the same tree at 0.987 of itself in 6 runs of 2 workers an arm)."""
    flip = (i // 2) % 2 if workers > 1 else 0
    return ("baseline", "candidate") if (i + flip) % 2 == 0 else ("candidate", "baseline")


def round_pair(i: int, workers: int) -> int:
    """The worker pair of round i: two rounds each, in turn, so that every pair runs both orders and
    the pairs share the rounds evenly."""
    return (i // 2) % workers


# -- one benchmark, both arms ----------------------------------------------------------------------

@dataclass
class Comparison:
    name: str
    spec: dict
    status: str = "compared"            # compared | not comparable
    reason: str = ""
    ops_per_sample: int = 0
    samples: dict = field(default_factory=lambda: {"baseline": [], "candidate": []})  # one per round
    pairs: list = field(default_factory=list)  # the worker pair of each round
    seconds: float = 0.0
    estimate: abstats.Estimate | None = None
    verdict: str = ""
    level: float = 0.0

    def median(self, arm: str) -> float:
        return statistics.median(self.samples[arm]) if self.samples[arm] else math.nan

    def interval(self) -> tuple[float, float]:
        return self.estimate.interval(self.level) if self.estimate else (math.nan, math.nan)

    def to_dict(self) -> dict:
        """For ab.json: strict JSON (no NaN or Infinity: None where a figure does not exist)."""
        def finite(x):
            return x if isinstance(x, (int, float)) and math.isfinite(x) else None

        low, high = (finite(v) for v in self.interval())
        return {"name": self.name, "spec": self.spec, "status": self.status, "reason": self.reason,
                "verdict": self.verdict, "rounds": len(self.samples["baseline"]), "ops_per_sample": self.ops_per_sample,
                "baseline_median_s": finite(self.median("baseline")),
                "candidate_median_s": finite(self.median("candidate")),
                "ratio": finite(self.estimate.ratio) if self.estimate else None, "interval": [low, high],
                "level": self.level, "p_slower": self.estimate.p_slower if self.estimate else None,
                "seconds": self.seconds,
                "samples": self.samples, "pairs": self.pairs}


def _sample(arm: Arm, ops: int) -> float:
    return statistics.median(arm.request("sample", ops=ops)["times"])


def _in_both(pools: dict[str, list[Arm]], command: str, **fields) -> dict[str, list[dict]]:
    """Every worker given works on one request at once (untimed work: setup; or a smoke run's
    samples, which nothing judges); each arm's answers in its workers' order. Every answer is read
    before the first error is raised, so that no worker is left with an unread reply."""
    workers = [(label, arm) for label, pool in pools.items() for arm in pool]
    for _, arm in workers:
        arm.send(command, **fields)
    answers, error = {label: [] for label in pools}, None
    for label, arm in workers:
        try:
            answers[label].append(arm.answer(command))
        except ArmError as e:
            error = error or e
    if error is not None:
        raise error
    return answers


def compare(name: str, spec: dict, arms: dict[str, Arm | list[Arm]], settings: Settings, family_size: int = 1,
            log=lambda _: None) -> Comparison:
    """Time one gated workload in both arms, interleaved, until decided or max_rounds. `arms`:
    "baseline" and "candidate", each a worker or a list of `settings.workers` workers."""
    result = Comparison(name, spec)
    start = time.perf_counter()
    pools = {label: group if isinstance(group, list) else [group] for label, group in arms.items()}
    if len({len(pool) for pool in pools.values()}) != 1:
        raise ValueError(f"both arms need as many workers: {({k: len(v) for k, v in pools.items()})}")
    answers = _in_both(pools, "setup", spec=spec)  # starting rank pools and models: most of a smoke run
    lacking = [a["not_comparable"] for a in answers["baseline"] if "not_comparable" in a]
    if lacking:
        result.status = "not comparable"
        result.reason = f"the baseline cannot run it: {lacking[0]}"
        for pool in pools.values():
            for arm in pool:
                arm.request("close")
        return result
    failed = [a["not_comparable"] for a in answers["candidate"] if "not_comparable" in a]
    if failed:
        raise ArmError(f"candidate: setup failed: {failed[0]}")
    workers = len(pools["baseline"])
    try:
        if settings.smoke:
            ops = 1
        else:
            # Untimed, at least two each: the first operation of a worker pays one-off costs (on a
            # GPU the CUDA context, cuDNN's first calls, the allocator's first blocks: 1 s against a
            # 10 ms step on an H200), so the samples are sized by each arm's fastest warm-up
            # operation. Sized by a median that included it, the first GPU gate took one-step
            # samples, 40 % apart (docs/gpu.md).
            warm = {label: [_sample(arm, 1) for arm in pool for _ in range(max(settings.warmup, 2))]
                    for label, pool in pools.items()}
            op_s = statistics.fmean(min(v) for v in warm.values())
            ops = max(1, round(settings.sample_s / max(op_s, 1e-6)))
        result.ops_per_sample = ops
        strictest = settings.alpha / family_size
        for i in range(settings.max_rounds):
            pair = round_pair(i, workers)
            if settings.smoke:  # it checks that the workload runs in both arms: nothing is timed against anything
                for label, (answer,) in _in_both({k: [v[pair]] for k, v in pools.items()}, "sample", ops=ops).items():
                    result.samples[label].append(statistics.median(answer["times"]))
            else:
                for label in round_order(i, workers):
                    result.samples[label].append(_sample(pools[label][pair], ops))
            result.pairs.append(pair)
            done = i + 1
            if (not settings.smoke and done >= settings.min_rounds and done < settings.max_rounds
                    and (done - settings.min_rounds) % settings.look_every == 0):
                # Only a verdict that cannot be a false `slower` ends a benchmark early: looking
                # for `slower` after every few rounds would test it again and again (a false
                # alarm rate up to 3x the nominal level, simulated). `slower` is judged once, at the end.
                est = abstats.estimate(result.samples["baseline"], result.samples["candidate"], settings.threshold)
                if abstats.settled(est, settings.threshold, strictest):
                    break
        _in_both(pools, "check")  # wrong results fail the run, in either arm
    finally:
        for arm in (arm for pool in pools.values() for arm in pool):  # each on its own: the first error is reported
            try:
                if arm.proc.poll() is None:
                    arm.request("close")
            except ArmError:
                arm.kill()
    result.estimate = abstats.estimate(result.samples["baseline"], result.samples["candidate"], settings.threshold)
    result.seconds = time.perf_counter() - start
    log(f"{name}: {len(result.samples['baseline'])} rounds, ratio {result.estimate.ratio:.3f}")
    return result


def judge(results: list[Comparison], settings: Settings) -> None:
    """Fill verdict and level of every compared benchmark, Holm-corrected across them."""
    compared = [r for r in results if r.status == "compared"]
    for r, (verdict, level) in zip(compared, abstats.decide([r.estimate for r in compared], settings.threshold,
                                                            settings.alpha)):
        r.verdict, r.level = verdict, level
    for r in results:
        if r.status != "compared":
            r.verdict = "not comparable"


