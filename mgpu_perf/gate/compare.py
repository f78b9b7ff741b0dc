"""The gate's comparison loop: one gated workload timed in both arms, interleaved round by round
(gate/rounds.py), sized from its first rounds (gate/sizing.py), judged by a paired test
(gate/stats.py), Holm-corrected across the run's benchmarks.

    result = compare("test_step[ddp-2]", spec, {"baseline": arm_a, "candidate": arm_b}, Settings(), family_size=7)
    results = judge(results, settings)       # every result with its verdict and level

Each arm is one long-lived worker process (gate/arm.py), or `workers` of them, importing the code
under test from its own tree and the candidate's harness, so the same benchmark code times both
trees. Per benchmark: every worker of both arms sets up at once and warms up (untimed), then the
rounds alternate the order, each round one sample per arm (the median of a few operations, about
`sample_s` seconds). The first look (at min_rounds, and every worker pair's rounds in) sizes the
rest of the run from the rounds' noise; from then on, every `look_every` rounds the interval is
checked at the strictest Holm level, and the benchmark stops early only when it is settled
(stats.settled: inside half the threshold, or faster); otherwise it runs the rounds it was sized
for, where `slower` is tested once (gate/looks.py).

The loop's state is one `looks.Benchmark`, its rounds a `buffer.RoundBuffer`; the result, a frozen
`Comparison` (gate/comparison.py), is built from them once the rounds are in.

After the warm-up, one more step is counted in both arms (gate/counted.py): what it does, exactly,
beside the time it takes. A worker that crashes, a workload that fails or computes a wrong result in
either arm raises ArmError: never "unchanged". A workload the baseline cannot even set up (an API the change added, a
model file it lacks) is `not comparable`, with the reason.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.arm import Arm, ArmError
from mgpu_perf.gate.buffer import RoundBuffer
from mgpu_perf.gate.comparison import Comparison
from mgpu_perf.gate.counted import Counted, count_in_both
from mgpu_perf.gate.health import RoundFacts, check_rounds
from mgpu_perf.gate.looks import REFUSAL_LOOKS, Benchmark, Next, first_look, later_look
from mgpu_perf.gate.rounds import Pools, agree_on_graphs, choose_clock, close_workers, in_both, sample_times, take_round
from mgpu_perf.gate.settings import Settings

__all__ = ["Settings", "Comparison", "compare", "judge", "with_round_health", "ArmError", "REFUSAL_LOOKS"]


def compare(name: str, spec: dict, arms: dict[str, Arm | list[Arm]], settings: Settings, family_size: int = 1,
            log=lambda _: None) -> Comparison:
    """Time one gated workload in both arms, interleaved, until decided, refused or its rounds are in.
    `arms`: "baseline" and "candidate", each a worker or a list of `settings.workers` workers.

    The first look also sizes the run from the rounds' noise (sizing.plan): a threshold under the
    worker pairs' floor, or one the budget cannot decide at any sample length, ends the benchmark
    there as `undecidable`, with the figures, once two more looks at as many new rounds each agree
    (the workers' first rounds may be their noisiest); one that needs longer samples starts its
    rounds again with them. Rounds set aside are kept as `pilot`, outside the estimate."""
    start = time.perf_counter()
    pools = {label: group if isinstance(group, list) else [group] for label, group in arms.items()}
    if len({len(pool) for pool in pools.values()}) != 1:
        raise ValueError(f"both arms need as many workers: {({k: len(v) for k, v in pools.items()})}")
    answers = in_both(pools, "setup", spec=spec)  # starting rank pools and models: most of a smoke run
    lacking = _lacking_in_the_baseline(answers)
    if lacking is not None:
        _close_unused(pools)
        return Comparison(name, spec, status="not comparable", reason=f"the baseline cannot run it: {lacking}",
                          budget_s=settings.budget_s)
    try:
        graphs = agree_on_graphs(pools, answers)
        bench = Benchmark(name, RoundBuffer(), pools, settings, settings.alpha / family_size, start,
                          timer=time.perf_counter, limit=settings.max_rounds)
        clock_reason = _warm_up(bench)
        bench.cpu_applies = bench.clock == "host" and all(a.get("in_process") for group in answers.values()
                                                          for a in group)
        counting_began = time.perf_counter()
        counted = count_in_both(pools) if settings.counts != "off" else Counted(reason="--ab-counts off")
        count_s = time.perf_counter() - counting_began
        rounds_began = bench.phase_began = time.perf_counter()
        _take_rounds(bench, log)
        round_s = (time.perf_counter() - rounds_began) / max(1, bench.rounds.rounds_taken())
        in_both(pools, "check")  # wrong results fail the run, in either arm
    finally:
        close_workers(pools)
    rounds = bench.rounds
    estimate = rounds.estimate(settings.threshold)
    result = Comparison(
        name, spec, status="compared" if bench.refusal is None else "undecidable", reason=bench.refusal or "",
        ops_per_sample=bench.ops, samples=rounds.samples, host_samples=rounds.host_samples, pairs=rounds.pairs,
        clock=bench.clock, clock_reason=clock_reason, graphs=graphs, plans=bench.plans, budget_s=settings.budget_s,
        pilot=rounds.pilot, seconds=time.perf_counter() - start, round_s=round_s, count_s=count_s,
        estimate=estimate, counted=counted, spent=bench.spent, early=bench.early, facts=rounds.facts,
        cpu_applies=bench.cpu_applies)
    log(f"{name}: {len(rounds.samples['baseline'])} rounds, ratio {estimate.ratio:.3f}")
    return result


def _lacking_in_the_baseline(answers: dict[str, list[dict]]) -> str | None:
    """Why the baseline cannot set the workload up (None when it can); ArmError when the candidate cannot."""
    lacking = [a["not_comparable"] for a in answers["baseline"] if "not_comparable" in a]
    if lacking:
        return str(lacking[0])
    failed = [a["not_comparable"] for a in answers["candidate"] if "not_comparable" in a]
    if failed:
        raise ArmError(f"candidate: setup failed: {failed[0]}")
    return None


def _close_unused(pools: Pools) -> None:
    """Every worker told to drop a workload nothing will time."""
    for pool in pools.values():
        for arm in pool:
            arm.request("close")


def _warm_up(bench: Benchmark) -> str:
    """The clock and the operations a sample, set in `bench`; why that clock. Untimed, at least two
    each: the first operation of a worker pays one-off costs (on a GPU the CUDA context, cuDNN's
    first calls, the allocator's first blocks: 1 s against a 10-ms step), so the samples are sized by
    each arm's fastest warm-up operation. A smoke run takes one operation a sample and times nothing."""
    settings = bench.settings
    if settings.smoke:
        bench.ops, bench.op_s, bench.clock = 1, math.nan, "host"
        return "a smoke run times nothing against anything"
    warm = {label: [arm.request("sample", ops=1) for arm in pool for _ in range(max(settings.warmup, 2))]
            for label, pool in bench.pools.items()}
    bench.clock, reason = choose_clock([a for group in warm.values() for a in group])
    bench.op_s = statistics.fmean(min(sample_times(a, bench.clock)[0] for a in group) for group in warm.values())
    bench.ops = max(1, round(settings.sample_s / max(bench.op_s, 1e-6)))
    return reason


def _take_rounds(bench: Benchmark, log) -> None:
    """Rounds until the phase's limit, or until a look says STOP; a RESTART begins the phase's rounds
    again (gate/looks.py)."""
    settings = bench.settings
    while bench.taken < bench.limit:
        bench.rounds.add_round(*take_round(bench.pools, bench.taken, bench.workers, bench.ops, bench.clock,
                                           settings.smoke))
        bench.taken += 1
        if settings.smoke or bench.taken < bench.first_look_at:
            continue
        step = first_look(bench, log) if bench.taken == bench.first_look_at else Next.GO_ON
        if step is Next.RESTART:
            continue
        if step is Next.STOP or later_look(bench) is Next.STOP:
            break


def judge(results: list[Comparison], settings: Settings) -> list[Comparison]:
    """Every result with its verdict and level (copies: results are frozen), Holm-corrected across the
    compared ones. A refusal look's tests spent part of a benchmark's level: its final test has the
    rest. Not comparable or undecidable: the status is the verdict (no test was made, so none joins
    Holm's)."""
    decided = iter(abstats.decide([r.estimate for r in results if r.status == "compared"], settings.threshold,
                                  settings.alpha))
    judged = []
    for r in results:
        if r.status != "compared":
            judged.append(dataclasses.replace(r, verdict=r.status))
            continue
        verdict, level = next(decided)
        level -= r.spent  # what the refusal looks' tests spent (at most half the strictest level)
        if r.spent:
            verdict = abstats.verdict(r.estimate, settings.threshold, level)
        judged.append(with_round_health(r, verdict, level, settings.threshold))
    return judged


def with_round_health(r: Comparison, verdict: str, level: float, threshold: float) -> Comparison:
    """The result judged `verdict` at `level`, its rounds' health (gate/health.py) checked: an
    `unchanged` whose rounds do not show it by every check becomes `undecidable`, the doubt its
    reason. Other verdicts stand (a `slower` is tested at its level whatever the rounds' health)."""
    health = check_rounds(r.samples, [RoundFacts.from_dict(f) for f in r.facts], threshold, level, r.cpu_applies,
                          r.clock)
    if verdict == "unchanged" and health.doubt:
        return dataclasses.replace(r, status="undecidable", verdict="undecidable", level=level, health=health,
                                   reason=f"no positive evidence of `unchanged` ({r.estimate.ratio:.3f}): "
                                          f"{health.doubt}")
    return dataclasses.replace(r, verdict=verdict, level=level, health=health)
