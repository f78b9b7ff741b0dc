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
for, where `slower` is tested once (gate/loop.py).

The loop's state is one `loop.RoundLoop` (gate/loop.py), which alone holds and changes it; this
module sets the workers up (rounds.set_up), runs the loop (loop.run_rounds) and builds the result,
a frozen `Comparison` (gate/comparison.py), from what the loop found (a frozen `loop.RoundsDone`).

After the warm-up, one more step is counted in both arms (gate/counted.py): what it does, exactly,
beside the time it takes. A worker that crashes, a workload that fails or computes a wrong result in
either arm raises ArmError: never "unchanged". A workload the baseline cannot even set up (an API the change added, a
model file it lacks) is `not comparable`, with the reason.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.arm import Arm, ArmError
from mgpu_perf.gate.comparison import Comparison
from mgpu_perf.gate.counted import Counted, count_in_both
from mgpu_perf.gate.health import RoundFacts, check_rounds
from mgpu_perf.gate.loop import REFUSAL_LOOKS, run_rounds
from mgpu_perf.gate.rounds import set_up
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
    ready = set_up(pools, spec, settings)  # the workers closed where it fails
    if ready.lacking is not None:
        return Comparison(name, spec, status="not comparable", reason=f"the baseline cannot run it: {ready.lacking}",
                          budget_s=settings.budget_s)
    count = partial(count_in_both, pools) if settings.counts != "off" else partial(Counted, reason="--ab-counts off")
    done = run_rounds(name, pools, ready, settings, settings.alpha / family_size, start, count,
                      log)  # the workers closed, whatever happened
    result = Comparison(
        name, spec, status=done.status, reason=done.reason, ops_per_sample=done.ops_per_sample, samples=done.samples,
        host_samples=done.host_samples, pairs=done.pairs, clock=done.clock, clock_reason=ready.clock_reason,
        graphs=ready.graphs, plans=done.plans, budget_s=settings.budget_s, pilot=done.pilot,
        seconds=time.perf_counter() - start, round_s=done.round_s, count_s=done.count_s, estimate=done.estimate,
        counted=done.counted, spent=done.spent, early=done.early, facts=done.facts, cpu_applies=done.cpu_applies)
    log(f"{name}: {len(done.samples['baseline'])} rounds, ratio {done.estimate.ratio:.3f}")
    return result


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
