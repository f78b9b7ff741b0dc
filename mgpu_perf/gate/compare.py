"""The gate's comparison loop: one gated workload timed in both arms, interleaved round by round
(gate/rounds.py), sized from its first rounds (gate/sizing.py), judged by a paired test
(gate/stats.py), Holm-corrected across the run's benchmarks.

    result = compare("test_step[ddp-2]", spec, {"baseline": arm_a, "candidate": arm_b}, Settings(), family_size=7)
    judge(results, settings)                 # fills verdict and level of every result

Each arm is one long-lived worker process (gate/arm.py), or `workers` of them, importing the code
under test from its own tree and the candidate's harness, so the same benchmark code times both
trees. Per benchmark: every worker of both arms sets up at once and warms up (untimed), then the
rounds alternate the order, each round one sample per arm (the median of a few operations, about
`sample_s` seconds). The first look (at min_rounds, and every worker pair's rounds in) sizes the
rest of the run from the rounds' noise; from then on, every `look_every` rounds the interval is
checked at the strictest Holm level, and the benchmark stops early only when it is settled
(stats.settled: inside half the threshold, or faster); otherwise it runs the rounds it was sized
for, where `slower` is tested once.

After the warm-up, one more step is counted in both arms (gate/counted.py): what it does, exactly,
beside the time it takes. A worker that crashes, a workload that fails or computes a wrong result in
either arm raises ArmError: never "unchanged". A workload the baseline cannot even set up (an API the change added, a
model file it lacks) is `not comparable`, with the reason.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from mgpu.jsonsafe import finite_or_none
from mgpu_perf.gate import sizing
from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.arm import Arm, ArmError
from mgpu_perf.gate.counted import Counted, count_in_both
from mgpu_perf.gate.rounds import Pools, agree_on_graphs, choose_clock, close_workers, in_both, sample_times, take_round
from mgpu_perf.gate.settings import Settings

__all__ = ["Settings", "Comparison", "compare", "judge", "ArmError", "REFUSAL_LOOKS"]

REFUSAL_LOOKS = 3  # looks at the noise, each at new rounds, before a benchmark is refused for it
HUNT_LOOKS = 6     # more such looks while the rounds in hand point to a slowdown (their ratio above 1 + T)


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
    plans: list = field(default_factory=list)   # the sizing of each phase (sizing.Plan.to_dict)
    budget_s: float = math.nan          # seconds it was given, set-up included (its share of the run's budget)
    pilot: dict | None = None           # rounds set aside: before a stretch or a second look (not in the estimate)
    seconds: float = 0.0
    round_s: float = math.nan           # seconds a round took (both arms), over every round taken
    count_s: float = 0.0                # seconds the counted step took (both arms at once)
    estimate: abstats.Estimate | None = None
    verdict: str = ""
    level: float = 0.0
    counted: Counted = field(default_factory=Counted)  # one step counted in both arms (gate/counted.py)
    spent: float = 0.0                  # level spent on `slower` tests at refusal looks (taken off the final test's)
    early: dict | None = None           # a refusal look whose rounds already showed `slower`: where, at what level

    def median(self, arm: str) -> float:
        return statistics.median(self.samples[arm]) if self.samples[arm] else math.nan

    def interval(self) -> tuple[float, float]:
        return self.estimate.interval(self.level) if self.estimate else (math.nan, math.nan)

    def noise(self) -> float:
        """The rounds' per-round log-ratio noise (sizing.round_noise), nan before two rounds."""
        return sizing.round_noise(self.estimate) if self.estimate else math.nan

    def pair_spread(self) -> float | None:
        logs = [math.log(c / b) for b, c in zip(self.samples["baseline"], self.samples["candidate"])]
        return sizing.pair_spread(logs, self.pairs)

    def estimate_now(self, threshold: float) -> abstats.Estimate:
        """The estimate from the rounds so far (outside the pilot)."""
        return abstats.estimate(self.samples["baseline"], self.samples["candidate"], threshold)

    def add_round(self, pair: int, times: dict) -> None:
        """One round's samples: {arm: (deciding time, host time)} from its worker pair."""
        for label, (decided, host) in times.items():
            self.samples[label].append(decided)
            self.host_samples[label].append(host)
        self.pairs.append(pair)

    def set_aside(self, ops: int) -> None:
        """Move the rounds taken so far to `pilot` (outside the estimate, kept in ab.json): rounds the
        sizing took as warm-up, or shorter samples than the stretched ones that follow."""
        pilot = self.pilot or {"ops_per_sample": ops, "ops": [], "samples": {"baseline": [], "candidate": []},
                               "host_samples": {"baseline": [], "candidate": []}, "pairs": []}
        for key in ("samples", "host_samples"):
            for label in ("baseline", "candidate"):
                pilot[key][label] += getattr(self, key)[label]
        pilot["pairs"] += self.pairs
        pilot["ops"] += [ops] * len(self.pairs)
        self.pilot = pilot
        self.samples = {"baseline": [], "candidate": []}
        self.host_samples = {"baseline": [], "candidate": []}
        self.pairs = []

    def take_back(self, ops: int) -> None:
        """Put the rounds set aside that had `ops` operations a sample back among the rounds (before
        them): a refusal look tests them all for `slower`."""
        if not self.pilot:
            return
        keep = [i for i, o in enumerate(self.pilot["ops"]) if o != ops]
        back = [i for i, o in enumerate(self.pilot["ops"]) if o == ops]
        for key in ("samples", "host_samples"):
            for label in ("baseline", "candidate"):
                old = self.pilot[key][label]
                getattr(self, key)[label][:0] = [old[i] for i in back]
                self.pilot[key][label] = [old[i] for i in keep]
        self.pairs[:0] = [self.pilot["pairs"][i] for i in back]
        self.pilot["pairs"] = [self.pilot["pairs"][i] for i in keep]
        self.pilot["ops"] = [self.pilot["ops"][i] for i in keep]
        if not self.pilot["ops"]:
            self.pilot = None

    def rounds_taken(self) -> int:
        """Every round taken, those set aside included."""
        return len(self.samples["baseline"]) + len((self.pilot or {}).get("samples", {}).get("baseline", []))

    def to_dict(self) -> dict:
        """For ab.json: strict JSON (no NaN or Infinity: None where a figure does not exist)."""
        return {"name": self.name, "spec": self.spec, "status": self.status, "reason": self.reason,
                "verdict": self.verdict, "rounds": len(self.samples["baseline"]), "ops_per_sample": self.ops_per_sample,
                "baseline_median_s": finite_or_none(self.median("baseline")),
                "candidate_median_s": finite_or_none(self.median("candidate")),
                "ratio": finite_or_none(self.estimate.ratio) if self.estimate else None,
                "interval": finite_or_none(self.interval()),
                "level": self.level, "p_slower": self.estimate.p_slower if self.estimate else None,
                "noise": finite_or_none(self.noise()), "pair_spread": self.pair_spread(), "plans": self.plans,
                "budget_s": finite_or_none(self.budget_s),
                "clock": self.clock, "clock_reason": self.clock_reason, "graphs": self.graphs,
                "seconds": self.seconds, "round_s": finite_or_none(self.round_s), "count_s": self.count_s, "samples": self.samples,
                "host_samples": self.host_samples,
                "pairs": self.pairs, "pilot": self.pilot, "counted": self.counted.to_dict(), "spent": self.spent,
                "early": self.early}


# -- one benchmark: its state, and the steps of its loop ---------------------------------------------

@dataclass
class _Benchmark:
    """Where one benchmark's rounds stand. A phase is the rounds taken since the start, or since the
    rounds before were set aside (a second look at the noise, or stretched samples)."""
    result: Comparison
    pools: Pools
    settings: Settings
    strictest: float         # the level of the strictest Holm step: alpha / the run's benchmarks
    start: float             # the benchmark's start: its budget counts from here, set-up and warm-up included
    ops: int = 1             # operations a sample
    op_s: float = math.nan   # seconds an operation, from the warm-up
    limit: int = 0           # the rounds this phase may take (sized at the first look, resized later)
    taken: int = 0           # the rounds this phase has taken
    phase_began: float = 0.0
    stretched: bool = False
    looks_left: int = REFUSAL_LOOKS - 1  # second looks a refusal for noise may still wait for
    hunts_left: int = HUNT_LOOKS         # looks more, where the rounds in hand point to a slowdown

    @property
    def workers(self) -> int:
        return len(self.pools["baseline"])

    @property
    def first_look(self) -> int:
        """Once every worker pair has had its two rounds, and min_rounds are in."""
        return max(self.settings.min_rounds, 2 * self.workers)

    def left_s(self, now: float) -> float:
        return self.settings.budget_s - (now - self.start)

    def restart(self, ops: int | None = None, limit: int | None = None) -> None:
        """Set this phase's rounds aside and begin a new phase (with `ops` a sample, `limit` rounds)."""
        self.result.set_aside(self.ops)
        if ops is not None:
            self.ops = self.result.ops_per_sample = ops
        if limit is not None:
            self.limit = limit
        self.taken, self.phase_began = 0, time.perf_counter()


def compare(name: str, spec: dict, arms: dict[str, Arm | list[Arm]], settings: Settings, family_size: int = 1,
            log=lambda _: None) -> Comparison:
    """Time one gated workload in both arms, interleaved, until decided, refused or its rounds are in.
    `arms`: "baseline" and "candidate", each a worker or a list of `settings.workers` workers.

    The first look also sizes the run from the rounds' noise (sizing.plan): a threshold under the
    worker pairs' floor, or one the budget cannot decide at any sample length, ends the benchmark
    there as `undecidable`, with the figures, once two more looks at as many new rounds each agree
    (the workers' first rounds may be their noisiest); one that needs longer samples starts its
    rounds again with them. Rounds set aside are kept as `pilot`, outside the estimate."""
    result = Comparison(name, spec, budget_s=settings.budget_s)
    start = time.perf_counter()
    pools = {label: group if isinstance(group, list) else [group] for label, group in arms.items()}
    if len({len(pool) for pool in pools.values()}) != 1:
        raise ValueError(f"both arms need as many workers: {({k: len(v) for k, v in pools.items()})}")
    answers = in_both(pools, "setup", spec=spec)  # starting rank pools and models: most of a smoke run
    if _not_comparable(pools, answers, result):
        return result
    try:
        result.graphs = agree_on_graphs(pools, answers)
        bench = _Benchmark(result, pools, settings, settings.alpha / family_size, start, limit=settings.max_rounds)
        _warm_up(bench)
        counting_began = time.perf_counter()
        result.counted = count_in_both(pools) if settings.counts != "off" else Counted(reason="--ab-counts off")
        result.count_s = time.perf_counter() - counting_began
        rounds_began = bench.phase_began = time.perf_counter()
        _take_rounds(bench, log)
        result.round_s = (time.perf_counter() - rounds_began) / max(1, result.rounds_taken())
        in_both(pools, "check")  # wrong results fail the run, in either arm
    finally:
        close_workers(pools)
    result.estimate = result.estimate_now(settings.threshold)
    result.seconds = time.perf_counter() - start
    log(f"{name}: {len(result.samples['baseline'])} rounds, ratio {result.estimate.ratio:.3f}")
    return result


def _not_comparable(pools: Pools, answers: dict[str, list[dict]], result: Comparison) -> bool:
    """True (and the workers told to close) when the baseline cannot set the workload up; ArmError
    when the candidate cannot."""
    lacking = [a["not_comparable"] for a in answers["baseline"] if "not_comparable" in a]
    if lacking:
        result.status = "not comparable"
        result.reason = f"the baseline cannot run it: {lacking[0]}"
        for pool in pools.values():
            for arm in pool:
                arm.request("close")
        return True
    failed = [a["not_comparable"] for a in answers["candidate"] if "not_comparable" in a]
    if failed:
        raise ArmError(f"candidate: setup failed: {failed[0]}")
    return False


def _warm_up(bench: _Benchmark) -> None:
    """The clock and the operations a sample. Untimed, at least two each: the first operation of a
    worker pays one-off costs (on a GPU the CUDA context, cuDNN's first calls, the allocator's first
    blocks: 1 s against a 10-ms step), so the samples are sized by each arm's fastest warm-up
    operation. A smoke run takes one operation a sample and times nothing."""
    result, settings = bench.result, bench.settings
    if settings.smoke:
        bench.ops, bench.op_s = 1, math.nan
        result.clock, result.clock_reason = "host", "a smoke run times nothing against anything"
    else:
        warm = {label: [arm.request("sample", ops=1) for arm in pool for _ in range(max(settings.warmup, 2))]
                for label, pool in bench.pools.items()}
        result.clock, result.clock_reason = choose_clock([a for group in warm.values() for a in group])
        bench.op_s = statistics.fmean(min(sample_times(a, result.clock)[0] for a in group) for group in warm.values())
        bench.ops = max(1, round(settings.sample_s / max(bench.op_s, 1e-6)))
    result.ops_per_sample = bench.ops


def _take_rounds(bench: _Benchmark, log) -> None:
    """Rounds until the phase's limit, the first look's refusal, or a look that finds it settled."""
    settings = bench.settings
    while bench.taken < bench.limit:
        bench.result.add_round(*take_round(bench.pools, bench.taken, bench.workers, bench.ops, bench.result.clock,
                                           settings.smoke))
        bench.taken += 1
        if settings.smoke or bench.taken < bench.first_look:
            continue
        step = _first_look(bench, log) if bench.taken == bench.first_look else None
        if step == "again":
            continue
        if step == "stop" or _settled_at_a_look(bench):
            break


def _first_look(bench: _Benchmark, log) -> str | None:
    """Size the rest from the first look's rounds (sizing.plan). "again": the rounds were set aside
    and the phase begins anew (a refusal for noise the budget holds another look for, or stretched
    samples); "stop": no more rounds (refused: `undecidable`, or all the rounds asked for are in);
    None: go on, the phase's limit set to the rounds planned."""
    result, settings, done = bench.result, bench.settings, bench.taken
    now = time.perf_counter()
    est = result.estimate_now(settings.threshold)
    plan = _size(bench, est, now)
    if plan.action == "refuse":
        under_floor = settings.threshold < plan.floor
        pointing = not under_floor and _slower_already(bench, log)
        if pointing == "slower":
            return "stop"
        unsettled = not abstats.settled(est, settings.threshold, bench.strictest)
        # Another look only where the budget holds it and as many rounds again after it. Fresh
        # workers' first rounds are often their noisiest, and noisy spells pass within seconds.
        # Past those looks, more while the rounds in hand point to a slowdown: each tests them all.
        time_for_look = 2 * (now - bench.phase_began) <= bench.left_s(now)
        hunt = not bench.looks_left and bench.hunts_left and pointing == "pointing"
        if not under_floor and (bench.looks_left or hunt) and done < bench.limit and time_for_look and unsettled:
            if hunt:
                bench.hunts_left -= 1
            else:
                bench.looks_left -= 1
            bench.restart()
            log(f"{result.name}: first rounds too noisy to size ({plan.message}); measuring again")
            return "again"
        # Under the floor: no verdict, whatever the rounds. Too noisy for the budget: no verdict
        # unless these rounds already settled it (or they are all the rounds asked for).
        if under_floor or (done < bench.limit and unsettled):
            result.status, result.reason = "undecidable", plan.message
            return "stop"
    if done >= bench.limit:
        return "stop"
    if plan.action == "stretch":  # the first rounds' samples are shorter, their noise larger: kept, not mixed in
        bench.stretched = True
        bench.restart(ops=max(bench.ops + 1, math.ceil(bench.ops * plan.stretch)), limit=plan.rounds)
        log(f"{result.name}: {plan.message}")
        return "again"
    bench.limit = min(bench.limit, max(plan.rounds, bench.first_look))
    return None


def _slower_already(bench: _Benchmark, log) -> str:
    """At a refusal look: do the rounds in hand (this look's and the earlier looks' at the same sample
    length) already show `slower`, too noisy as they are to size a change of the threshold? Each
    such look tests at a level of its own, sizing.early_level (a share of the strictest Holm level,
    spent: the final test's level is what is left), so a clear slowdown is called at the look where
    it is clear and `undecidable` means the data could not decide. "slower"; "pointing" (their
    ratio is above 1 + T: worth more looks); or ""."""
    result, settings = bench.result, bench.settings
    level = sizing.early_level(bench.strictest, REFUSAL_LOOKS + HUNT_LOOKS)
    pooled = abstats.estimate(result.samples["baseline"] + _set_aside(result, bench.ops, "baseline"),
                              result.samples["candidate"] + _set_aside(result, bench.ops, "candidate"),
                              settings.threshold)
    result.spent += level
    if abstats.verdict(pooled, settings.threshold, level) != "slower":
        return "pointing" if pooled.ratio > 1 + settings.threshold else ""
    result.take_back(bench.ops)
    result.early = {"rounds": pooled.rounds, "level": level, "interval": list(pooled.interval(level))}
    log(f"{result.name}: slower already at a refusal look ({pooled.rounds} rounds, ratio {pooled.ratio:.3f})")
    return "slower"


def _set_aside(result: Comparison, ops: int, arm: str) -> list[float]:
    pilot = result.pilot or {"ops": [], "samples": {arm: []}}
    return [t for t, o in zip(pilot["samples"][arm], pilot["ops"]) if o == ops]


def _size(bench: _Benchmark, est: abstats.Estimate, now: float) -> sizing.Plan:
    """The plan from this phase's rounds: their noise, the time a round took, the time left."""
    settings = bench.settings
    plan = sizing.plan(sizing.round_noise(est), settings.threshold, bench.strictest, settings.max_rounds,
                       (now - bench.phase_began) / bench.taken, bench.ops * bench.op_s, bench.left_s(now),
                       settings.pair_bias, bench.workers, may_stretch=not bench.stretched, low=sizing.noise_low(est))
    bench.result.plans.append(plan.to_dict())
    return plan


def _settled_at_a_look(bench: _Benchmark) -> bool:
    """Every look_every rounds from the first look: True when the interval is settled before the
    last round (the benchmark stops). Only a verdict that cannot be a false `slower` ends a benchmark
    early: looking for `slower` after every few rounds would test it again and again (a false alarm
    rate up to 3x the nominal level, simulated); `slower` is judged once, at the end. Past the first
    look, the rounds to run are resized from all the rounds so far (_resized)."""
    settings, done = bench.settings, bench.taken
    if done > bench.limit or (done - bench.first_look) % settings.look_every:
        return False
    est = bench.result.estimate_now(settings.threshold)
    if done < bench.limit and abstats.settled(est, settings.threshold, bench.strictest):
        return True
    if done > bench.first_look:
        bench.limit = _resized(bench, est)
    return False


def _resized(bench: _Benchmark, est: abstats.Estimate) -> int:
    """The rounds to run, looked at again from all the rounds so far: more (within max_rounds and
    the budget) when the noise has grown since the first look sized the run; never fewer. Only the
    noise sets it, never the ratio, and `slower` is still tested once, at the end."""
    settings, done = bench.settings, bench.taken
    now = time.perf_counter()
    round_s = (now - bench.phase_began) / done
    fits = done + int(max(0.0, bench.left_s(now)) / max(round_s, 1e-9))
    want = sizing.rounds_to_run(sizing.round_noise(est), settings.threshold, bench.strictest, settings.pair_bias,
                                bench.workers)
    return max(bench.limit, min(want, settings.max_rounds, fits))


def judge(results: list[Comparison], settings: Settings) -> None:
    """Fill verdict and level of every compared benchmark, Holm-corrected across them."""
    compared = [r for r in results if r.status == "compared"]
    for r, (verdict, level) in zip(compared, abstats.decide([r.estimate for r in compared], settings.threshold,
                                                            settings.alpha)):
        r.level = level - r.spent  # what the refusal looks' tests spent (at most half the strictest level)
        r.verdict = abstats.verdict(r.estimate, settings.threshold, r.level) if r.spent else verdict
    for r in results:
        if r.status != "compared":
            r.verdict = r.status  # not comparable | undecidable: no test was made, so none joins Holm's
