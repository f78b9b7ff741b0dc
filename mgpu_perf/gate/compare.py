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

__all__ = ["Settings", "round_order", "round_pair", "Comparison", "choose_clock", "compare", "judge", "ArmError"]


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.10   # the slowdown the gate exists to catch (fraction)
    alpha: float = 0.05       # chance of any false `slower` in a whole run (Holm across benchmarks)
    min_rounds: int = 10
    max_rounds: int = 200     # a cap: each benchmark runs the rounds its noise needs (stats.plan), within budget_s
    look_every: int = 5       # rounds between looks at the interval, once min_rounds are in
    warmup: int = 2           # untimed samples per arm before the rounds
    sample_s: float = 0.25    # target duration of one sample (a whole number of operations)
    workers: int = 1          # worker processes per arm; the rounds rotate through their pairs
    strict: bool = False      # `inconclusive` (and `undecidable`) fails the run too
    smoke: bool = False       # --benchmark-disable: exercise the machinery, judge nothing
    budget_s: float = 120.0   # seconds one benchmark may take, its set-up included
    run_budget_s: float = 300.0  # seconds a whole gate run may take, shared by the benchmarks left (0: none)
    pair_bias: float = abstats.PAIR_BIAS  # sd of one worker pair's bias: sets the threshold's floor
    graphs: str = "auto"      # CUDA-graph steps: auto | on | off (harness/graphs.py)
    amp: str = "off"          # the workloads' --amp: off | bf16
    compile: bool = False     # the workloads' --compile (torch.compile)


workers_for = abstats.workers_for  # the auto count of worker processes an arm (stats.workers_for)


REFUSAL_LOOKS = 3  # looks at the noise, each at new rounds, before a benchmark is refused for it


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
    status: str = "compared"            # compared | not comparable | undecidable (the reason says why)
    reason: str = ""
    ops_per_sample: int = 0
    samples: dict = field(default_factory=lambda: {"baseline": [], "candidate": []})  # one per round, by `clock`
    host_samples: dict = field(default_factory=lambda: {"baseline": [], "candidate": []})  # host wall time beside
    pairs: list = field(default_factory=list)  # the worker pair of each round
    clock: str = "host"                 # what decided: host (wall time) | cuda-events (the step's stream)
    clock_reason: str = ""
    graphs: dict = field(default_factory=dict)  # per arm: captured or not, and why not
    plans: list = field(default_factory=list)   # the sizing of each phase (stats.Plan.to_dict)
    budget_s: float = math.nan          # seconds it was given, set-up included (its share of the run's budget)
    pilot: dict | None = None           # rounds set aside: before a stretch or a second look (not in the estimate)
    seconds: float = 0.0
    round_s: float = math.nan           # seconds a round took (both arms), over every round taken
    estimate: abstats.Estimate | None = None
    verdict: str = ""
    level: float = 0.0

    def median(self, arm: str) -> float:
        return statistics.median(self.samples[arm]) if self.samples[arm] else math.nan

    def interval(self) -> tuple[float, float]:
        return self.estimate.interval(self.level) if self.estimate else (math.nan, math.nan)

    def noise(self) -> float:
        """The rounds' per-round log-ratio noise (stats.round_noise), nan before two rounds."""
        return abstats.round_noise(self.estimate) if self.estimate else math.nan

    def pair_spread(self) -> float | None:
        logs = [math.log(c / b) for b, c in zip(self.samples["baseline"], self.samples["candidate"])]
        return abstats.pair_spread(logs, self.pairs)

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
                "noise": finite(self.noise()), "pair_spread": self.pair_spread(), "plans": self.plans,
                "budget_s": finite(self.budget_s),
                "clock": self.clock, "clock_reason": self.clock_reason, "graphs": self.graphs,
                "seconds": self.seconds, "round_s": finite(self.round_s), "samples": self.samples,
                "host_samples": self.host_samples,
                "pairs": self.pairs, "pilot": self.pilot}


def choose_clock(answers: list[dict]) -> tuple[str, str]:
    """Which time decides, from every worker's answer to a sample: the step's CUDA stream
    (`device_times`, CUDA events) when every worker of both arms timed it there, else host wall
    time, with the reason. Both arms must be timed by one clock, or the ratio compares two clocks."""
    notes = [a.get("clock_note") for a in answers if "device_times" not in a]
    if not notes:
        return "cuda-events", "every worker timed the step on its CUDA stream (host wall time beside it)"
    return "host", next((n for n in notes if n), "host wall time")


def _times(answer: dict, clock: str) -> tuple[float, float]:
    """(the deciding time, host time) of one sample: medians of its operations."""
    host = statistics.median(answer["times"])
    return (statistics.median(answer["device_times"]) if clock == "cuda-events" else host), host


def _sample(arm: Arm, ops: int, clock: str = "host") -> tuple[float, float]:
    return _times(arm.request("sample", ops=ops), clock)


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


def _agree_on_graphs(pools: dict[str, list[Arm]], answers: dict[str, list[dict]], result: Comparison) -> None:
    """CUDA-graph steps in every worker or in none: a worker whose step could not be captured
    keeps its plain step, and the others are told to drop their graphs, so both arms time one kind
    of step. result.graphs: each arm's first answer (captured, and why not)."""
    states = {label: [a.get("graphs", {"captured": False, "why": "the worker did not say"}) for a in group]
              for label, group in answers.items()}
    result.graphs = {label: group[0] for label, group in states.items()}
    captured = [s["captured"] for group in states.values() for s in group]
    if any(captured) and not all(captured):
        why = next(f"{label}: {s['why']}" for label, group in states.items() for s in group if not s["captured"])
        for label, pool in pools.items():
            for arm, state in zip(pool, states[label]):
                if state["captured"]:
                    arm.request("graphs", enabled=False)
        result.graphs = {label: {"captured": False, "why": f"dropped: {why}"} for label in states}


def _take_round(pools, result: Comparison, i: int, workers: int, ops: int, settings: Settings) -> None:
    pair = round_pair(i, workers)
    if settings.smoke:  # it checks that the workload runs in both arms: nothing is timed against anything
        for label, (answer,) in _in_both({k: [v[pair]] for k, v in pools.items()}, "sample", ops=ops).items():
            decided, host = _times(answer, result.clock)
            result.samples[label].append(decided)
            result.host_samples[label].append(host)
    else:
        for label in round_order(i, workers):
            decided, host = _sample(pools[label][pair], ops, result.clock)
            result.samples[label].append(decided)
            result.host_samples[label].append(host)
    result.pairs.append(pair)


def _set_aside(result: Comparison, ops: int) -> None:
    """Move the rounds taken so far to `pilot` (outside the estimate, kept in ab.json): rounds the
    sizing took as warm-up, or shorter samples than the stretched ones that follow."""
    pilot = result.pilot or {"ops_per_sample": ops, "ops": [], "samples": {"baseline": [], "candidate": []},
                             "host_samples": {"baseline": [], "candidate": []}, "pairs": []}
    for key in ("samples", "host_samples"):
        for label in ("baseline", "candidate"):
            pilot[key][label] += getattr(result, key)[label]
    pilot["pairs"] += result.pairs
    pilot["ops"] += [ops] * len(result.pairs)
    result.pilot = pilot
    result.samples = {"baseline": [], "candidate": []}
    result.host_samples = {"baseline": [], "candidate": []}
    result.pairs = []


def _resized(limit: int, done: int, est: abstats.Estimate, settings: Settings, strictest: float, workers: int,
             start: float, phase_began: float) -> int:
    """The rounds to run, looked at again from all the rounds so far: more (within max_rounds and
    the budget) when the noise has grown since the first look sized the run; never fewer. Two
    decisions in 15 at 10 % were sized at 2.5-3.7 % noise, went on at far more, and ended
    `inconclusive` at 40 rounds (docs/gate.md section 8). Only the noise sets it, never the
    ratio, and `slower` is still tested once, at the end."""
    now = time.perf_counter()
    round_s = (now - phase_began) / done
    fits = done + int(max(0.0, settings.budget_s - (now - start)) / max(round_s, 1e-9))
    want = abstats.rounds_to_run(abstats.round_noise(est), settings.threshold, strictest, settings.pair_bias, workers)
    return max(limit, min(want, settings.max_rounds, fits))


def _size(result: Comparison, settings: Settings, strictest: float, round_s: float, sample_s: float,
          budget_left: float, workers: int, may_stretch: bool) -> abstats.Plan:
    est = abstats.estimate(result.samples["baseline"], result.samples["candidate"], settings.threshold)
    plan = abstats.plan(abstats.round_noise(est), settings.threshold, strictest, settings.max_rounds, round_s,
                        sample_s, budget_left, settings.pair_bias, workers, may_stretch=may_stretch,
                        low=abstats.noise_low(est))
    result.plans.append(plan.to_dict())
    return plan


def compare(name: str, spec: dict, arms: dict[str, Arm | list[Arm]], settings: Settings, family_size: int = 1,
            log=lambda _: None) -> Comparison:
    """Time one gated workload in both arms, interleaved, until decided, refused or max_rounds.
    `arms`: "baseline" and "candidate", each a worker or a list of `settings.workers` workers.

    The first look (at min_rounds) also sizes the run from the rounds' noise (stats.plan): a
    threshold under the worker pairs' floor, or one the budget cannot decide at any sample length,
    ends the benchmark there as `undecidable`, with the figures, once two more looks at as many new
    rounds each agree (the workers' first rounds may be their noisiest); one that needs longer samples
    starts its rounds again with them. Rounds set aside are kept as `pilot`, outside the estimate."""
    result = Comparison(name, spec, budget_s=settings.budget_s)
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
        _agree_on_graphs(pools, answers, result)
        if settings.smoke:
            ops, op_s = 1, math.nan
            result.clock, result.clock_reason = "host", "a smoke run times nothing against anything"
        else:
            # Untimed, at least two each: the first operation of a worker pays one-off costs (on a
            # GPU the CUDA context, cuDNN's first calls, the allocator's first blocks: 1 s against a
            # 10 ms step on an H200), so the samples are sized by each arm's fastest warm-up
            # operation. Sized by a median that included it, the first GPU gate took one-step
            # samples, 40 % apart (docs/gpu.md).
            warm = {label: [arm.request("sample", ops=1) for arm in pool for _ in range(max(settings.warmup, 2))]
                    for label, pool in pools.items()}
            result.clock, result.clock_reason = choose_clock([a for group in warm.values() for a in group])
            op_s = statistics.fmean(min(_times(a, result.clock)[0] for a in group) for group in warm.values())
            ops = max(1, round(settings.sample_s / max(op_s, 1e-6)))
        result.ops_per_sample = ops
        strictest = settings.alpha / family_size
        limit, i, stretched = settings.max_rounds, 0, False
        # The first look waits until every worker pair has had its two rounds. A refusal for noise
        # waits for up to two more looks at as many new rounds each, the rounds before set aside:
        # fresh workers' first rounds were the noisiest here (14 % a round in a refused decision,
        # 2-6 % typical), and this VM's noisy spells (16-24 % a round) pass within seconds as often
        # as not (docs/gate.md section 4).
        first_look = max(settings.min_rounds, 2 * workers)
        looks_left = REFUSAL_LOOKS - 1
        # The budget counts from the benchmark's `start` (worker set-up and warm-up included), so that
        # the budgets a run shares out (run.share_of_run) add up to the run's time.
        rounds_began = phase_began = time.perf_counter()
        while i < limit:
            _take_round(pools, result, i, workers, ops, settings)
            i += 1
            done = i
            if settings.smoke or done < first_look:
                continue
            if done == first_look:
                now = time.perf_counter()
                plan = _size(result, settings, strictest, (now - phase_began) / done, ops * op_s,
                             settings.budget_s - (now - start), workers, may_stretch=not stretched)
                est = abstats.estimate(result.samples["baseline"], result.samples["candidate"], settings.threshold)
                under_floor = settings.threshold < plan.floor
                # Another look only where the budget holds it and as many rounds again after it.
                time_for_look = 2 * (now - phase_began) <= settings.budget_s - (now - start)
                if (plan.action == "refuse" and not under_floor and looks_left and done < limit and time_for_look
                        and not abstats.settled(est, settings.threshold, strictest)):
                    # Taken as the workers' warm-up, or a noisy spell: set aside, and measured again.
                    _set_aside(result, ops)
                    i, looks_left, phase_began = 0, looks_left - 1, time.perf_counter()
                    log(f"{name}: first rounds too noisy to size ({plan.message}); measuring again")
                    continue
                # Under the floor: no verdict, whatever the rounds. Too noisy for the budget: no verdict
                # unless these rounds already settled it (or they are all the rounds asked for).
                if plan.action == "refuse" and (under_floor or (
                        done < limit and not abstats.settled(est, settings.threshold, strictest))):
                    result.status, result.reason = "undecidable", plan.message
                    break
                if done >= limit:
                    break
                if plan.action == "stretch":
                    # The first rounds' samples are shorter, their noise larger: kept, not mixed in.
                    _set_aside(result, ops)
                    ops = max(ops + 1, math.ceil(ops * plan.stretch))
                    result.ops_per_sample = ops
                    limit, i, stretched, phase_began = plan.rounds, 0, True, time.perf_counter()
                    log(f"{name}: {plan.message}")
                    continue
                limit = min(limit, max(plan.rounds, first_look))
            if done <= limit and (done - first_look) % settings.look_every == 0:
                # Only a verdict that cannot be a false `slower` ends a benchmark early: looking
                # for `slower` after every few rounds would test it again and again (a false
                # alarm rate up to 3x the nominal level, simulated). `slower` is judged once, at the end.
                est = abstats.estimate(result.samples["baseline"], result.samples["candidate"], settings.threshold)
                if done < limit and abstats.settled(est, settings.threshold, strictest):
                    break
                if done > first_look:
                    limit = _resized(limit, done, est, settings, strictest, workers, start, phase_began)
        taken = len(result.samples["baseline"]) + len((result.pilot or {}).get("samples", {}).get("baseline", []))
        result.round_s = (time.perf_counter() - rounds_began) / max(1, taken)
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
            r.verdict = r.status  # not comparable | undecidable: no test was made, so none joins Holm's


