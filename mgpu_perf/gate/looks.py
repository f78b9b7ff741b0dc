"""The looks of the gate's loop (gate/compare.py) at one benchmark's rounds, and the state they
change. The first look (at min_rounds, and every worker pair's rounds in) sizes the rest of the run
from the rounds' noise (sizing.plan); from then on, every `look_every` rounds, a later look checks
the interval at the strictest Holm level and stops the benchmark only when it is settled.

    bench = Benchmark(name, RoundBuffer(), pools, settings, strictest, start, timer=time.perf_counter)
    step = first_look(bench, log)     # Next.GO_ON | Next.RESTART | Next.STOP
    step = later_look(bench)          # Next.GO_ON | Next.STOP (not when settled rounds are doubted: health.py)

Each look says what comes next as a `Next`; what it changed (the phase's limit, rounds set aside,
a plan, a level spent, a refusal) is in `bench`, and nowhere else; the time too is read from
`bench.timer` alone (compare's clock: the tests simulate it). A refusal look may test the
rounds in hand for `slower`: early_test asks (it changes nothing), spend_early_test counts its
level as spent and, on `slower`, takes the rounds set aside back to be judged.
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from mgpu_perf.gate import sizing
from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.buffer import RoundBuffer
from mgpu_perf.gate.health import RoundFacts, check_rounds
from mgpu_perf.gate.rounds import Pools
from mgpu_perf.gate.settings import Settings

__all__ = ["Next", "Benchmark", "EarlyTest", "early_test", "spend_early_test", "first_look", "later_look",
           "REFUSAL_LOOKS", "HUNT_LOOKS"]

REFUSAL_LOOKS = 3  # looks at the noise, each at new rounds, before a benchmark is refused for it
HUNT_LOOKS = 6     # more such looks while the rounds in hand point to a slowdown (their ratio above 1 + T)


class Next(enum.Enum):
    """What a look decides about the rounds after it."""
    GO_ON = "go on"      # the phase's rounds go on, up to its limit
    RESTART = "restart"  # this phase's rounds were set aside: a new phase begins, its rounds from 0
    STOP = "stop"        # no more rounds: refused, settled, or all the rounds asked for are in


@dataclass
class Benchmark:
    """Where one benchmark's rounds stand: the loop's whole state. A phase is the rounds taken since
    the start, or since the rounds before were set aside (a second look at the noise, or stretched
    samples). `plans`, `spent`, `early` and `refusal` are what the looks found, for the result."""
    name: str
    rounds: RoundBuffer
    pools: Pools
    settings: Settings
    strictest: float         # the level of the strictest Holm step: alpha / the run's benchmarks
    start: float             # the benchmark's start: its budget counts from here, set-up and warm-up included
    timer: Callable[[], float] = time.perf_counter  # what `start` and every phase are timed by
    clock: str = "host"      # the deciding clock, chosen at the warm-up (rounds.choose_clock)
    ops: int = 1             # operations a sample
    op_s: float = math.nan   # seconds an operation, from the warm-up
    limit: int = 0           # the rounds this phase may take (sized at the first look, resized later)
    taken: int = 0           # the rounds this phase has taken
    phase_began: float = 0.0
    stretched: bool = False
    looks_left: int = REFUSAL_LOOKS - 1  # second looks a refusal for noise may still wait for
    hunts_left: int = HUNT_LOOKS         # looks more, where the rounds in hand point to a slowdown
    plans: list = field(default_factory=list)  # each first look's sizing (sizing.Plan.to_dict)
    spent: float = 0.0       # the level the refusal looks' `slower` tests spent
    early: dict | None = None  # a refusal look whose rounds already showed `slower`: where, at what level
    refusal: str | None = None  # why no verdict can be had (`undecidable`), once a look refused
    cpu_applies: bool = False   # the step runs in the workers' processes on the host clock (gate/health.py)

    @property
    def workers(self) -> int:
        return len(self.pools["baseline"])

    @property
    def first_look_at(self) -> int:
        """The phase's rounds at its first look: every worker pair's two rounds, and min_rounds."""
        return max(self.settings.min_rounds, 2 * self.workers)

    def left_s(self, now: float) -> float:
        return self.settings.budget_s - (now - self.start)

    def restart(self, ops: int | None = None, limit: int | None = None) -> None:
        """Set this phase's rounds aside and begin a new phase (with `ops` a sample, `limit` rounds)."""
        self.rounds.set_aside(self.ops)
        if ops is not None:
            self.ops = ops
        if limit is not None:
            self.limit = limit
        self.taken, self.phase_began = 0, self.timer()


@dataclass(frozen=True)
class EarlyTest:
    """A `slower` test at a refusal look, on the rounds in hand: this look's and the earlier looks'
    at the same sample length, at a level of its own (sizing.early_level)."""
    level: float
    pooled: abstats.Estimate
    slower: bool

    def points_to_a_slowdown(self, threshold: float) -> bool:
        """Not `slower` yet, but the ratio above 1 + T: worth more looks."""
        return not self.slower and self.pooled.ratio > 1 + threshold


def early_test(rounds: RoundBuffer, ops: int, threshold: float, strictest: float) -> EarlyTest:
    """Do the rounds in hand already show `slower`, too noisy as they are to size a change of the
    threshold? Each refusal look tests at sizing.early_level: a share of the strictest Holm level,
    spent (the final test's level is what is left), so a clear slowdown is called at the look where
    it is clear and `undecidable` means the data could not decide."""
    level = sizing.early_level(strictest, REFUSAL_LOOKS + HUNT_LOOKS)
    pooled = abstats.estimate(rounds.samples["baseline"] + rounds.set_aside_at(ops, "baseline"),
                              rounds.samples["candidate"] + rounds.set_aside_at(ops, "candidate"), threshold)
    return EarlyTest(level, pooled, abstats.verdict(pooled, threshold, level) == "slower")


def spend_early_test(bench: Benchmark, test: EarlyTest, log) -> None:
    """The test's level counts as spent, whatever it found. On `slower` the rounds set aside at this
    sample length go back among the rounds (the benchmark is judged on all it tested), and where it
    was called is kept (`early`)."""
    bench.spent += test.level
    if not test.slower:
        return
    bench.rounds.take_back(bench.ops)
    bench.early = {"rounds": test.pooled.rounds, "level": test.level,
                   "interval": list(test.pooled.interval(test.level))}
    log(f"{bench.name}: slower already at a refusal look ({test.pooled.rounds} rounds, ratio "
        f"{test.pooled.ratio:.3f})")


def first_look(bench: Benchmark, log) -> Next:
    """Size the rest from the first look's rounds (sizing.plan). RESTART: the rounds were set aside
    and the phase begins anew (a refusal for noise the budget holds another look for, or stretched
    samples); STOP: no more rounds (refused: bench.refusal says why; or all the rounds asked for are
    in); GO_ON: the phase's limit set to the rounds planned."""
    now = bench.timer()
    est = bench.rounds.estimate(bench.settings.threshold)
    plan = _size(bench, est, now)
    if plan.action == "refuse":
        step = _at_a_refusal(bench, plan, est, now, log)
        if step is not Next.GO_ON:
            return step
    if bench.taken >= bench.limit:
        return Next.STOP
    if plan.action == "stretch":  # the first rounds' samples are shorter, their noise larger: kept, not mixed in
        bench.stretched = True
        bench.restart(ops=max(bench.ops + 1, math.ceil(bench.ops * plan.stretch)), limit=plan.rounds)
        log(f"{bench.name}: {plan.message}")
        return Next.RESTART
    bench.limit = min(bench.limit, max(plan.rounds, bench.first_look_at))
    return Next.GO_ON


def _at_a_refusal(bench: Benchmark, plan: sizing.Plan, est: abstats.Estimate, now: float, log) -> Next:
    """A first look whose plan refuses: STOP when its rounds already show `slower` (early_test), or
    when no verdict can be had (bench.refusal set: `undecidable`); RESTART for another look at new
    rounds; GO_ON when these rounds settled it (or are all the rounds asked for): judged on them."""
    settings, done = bench.settings, bench.taken
    under_floor = settings.threshold < plan.floor
    test = None if under_floor else early_test(bench.rounds, bench.ops, settings.threshold, bench.strictest)
    if test is not None:
        spend_early_test(bench, test, log)
        if test.slower:
            return Next.STOP
    unsettled = not abstats.settled(est, settings.threshold, bench.strictest)
    # Another look only where the budget holds it and as many rounds again after it. Fresh
    # workers' first rounds are often their noisiest, and noisy spells pass within seconds.
    # Past those looks, more while the rounds in hand point to a slowdown: each tests them all.
    time_for_look = 2 * (now - bench.phase_began) <= bench.left_s(now)
    hunt = not bench.looks_left and bench.hunts_left and test is not None and \
        test.points_to_a_slowdown(settings.threshold)
    if not under_floor and (bench.looks_left or hunt) and done < bench.limit and time_for_look and unsettled:
        if hunt:
            bench.hunts_left -= 1
        else:
            bench.looks_left -= 1
        bench.restart()
        log(f"{bench.name}: first rounds too noisy to size ({plan.message}); measuring again")
        return Next.RESTART
    # Under the floor: no verdict, whatever the rounds. Too noisy for the budget: no verdict
    # unless these rounds already settled it (or they are all the rounds asked for).
    if under_floor or (done < bench.limit and unsettled):
        bench.refusal = plan.message
        return Next.STOP
    return Next.GO_ON


def _size(bench: Benchmark, est: abstats.Estimate, now: float) -> sizing.Plan:
    """The plan from this phase's rounds (their noise, the time a round took, the time left), kept
    in bench.plans."""
    settings = bench.settings
    budget = sizing.Budget(settings.threshold, bench.strictest, settings.max_rounds,
                           round_s=(now - bench.phase_began) / bench.taken, sample_s=bench.ops * bench.op_s,
                           budget_left_s=bench.left_s(now), pair_bias=settings.pair_bias, workers=bench.workers)
    plan = sizing.plan(budget, sizing.round_noise(est), low=sizing.noise_low(est), may_stretch=not bench.stretched)
    bench.plans.append(plan.to_dict())
    return plan


def later_look(bench: Benchmark) -> Next:
    """Every look_every rounds from the first look: STOP when the interval is settled before the
    last round. Only a verdict that cannot be a false `slower` ends a benchmark early: looking for
    `slower` after every few rounds would test it again and again (a false alarm rate up to 3x the
    nominal level, simulated); `slower` is judged once, at the end. Past the first look, the phase's
    limit is resized from all the rounds so far (resized_limit); else GO_ON."""
    settings, done = bench.settings, bench.taken
    if done > bench.limit or (done - bench.first_look_at) % settings.look_every:
        return Next.GO_ON
    est = bench.rounds.estimate(settings.threshold)
    if done < bench.limit and abstats.settled(est, settings.threshold, bench.strictest) and not doubted(bench):
        return Next.STOP
    if done > bench.first_look_at:
        bench.limit = resized_limit(bench, est, bench.timer())
    return Next.GO_ON


def doubted(bench: Benchmark) -> str:
    """Why the rounds so far could not stand as `unchanged` (gate/health.py; "" when they could): a
    settled benchmark whose rounds are doubted is not stopped early but runs the rounds it was sized
    for, so that its verdict rests on more rounds than the doubted ones."""
    rounds = bench.rounds
    facts = [RoundFacts.from_dict(f) for f in rounds.facts]
    return check_rounds(rounds.samples, facts, bench.settings.threshold, bench.strictest, bench.cpu_applies,
                        bench.clock).doubt


def resized_limit(bench: Benchmark, est: abstats.Estimate, now: float) -> int:
    """The rounds to run, looked at again from all the rounds so far: more (within max_rounds and
    the budget) when the noise has grown since the first look sized the run; never fewer. Only the
    noise sets it, never the ratio, and `slower` is still tested once, at the end."""
    settings, done = bench.settings, bench.taken
    round_s = (now - bench.phase_began) / done
    fits = done + int(max(0.0, bench.left_s(now)) / max(round_s, 1e-9))
    want = sizing.rounds_to_run(sizing.round_noise(est), settings.threshold, bench.strictest, settings.pair_bias,
                                bench.workers)
    return max(bench.limit, min(want, settings.max_rounds, fits))
