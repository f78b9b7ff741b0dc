"""One benchmark's round loop in the A/B gate, in one place: after the warm-up (gate/rounds.py
set_up), its counted step, its rounds in phases, the looks at them that size, restart or stop it,
the workers' check and close; what it found comes out frozen. gate/compare.py starts it and reads
the result; nothing else holds or changes the loop's state.

    done = run_rounds(name, pools, ready, settings, strictest, start, count, log)
    done.status, done.estimate.ratio, done.samples["baseline"], done.plans, done.pilot   # a RoundsDone

A phase is the rounds taken since the start, or since the rounds before were set aside (a second
look at the noise, or stretched samples). The first look (at min_rounds, and every worker pair's
rounds in) sizes the rest of the run from the rounds' noise (sizing.plan_for); from then on, every
`look_every` rounds, a later look checks the interval at the strictest Holm level and stops the
benchmark only when it is settled and its rounds are not doubted (gate/health.py), and resizes
the phase's limit from all its rounds (sizing.resized_limit). A refusal look may test the rounds in
hand for `slower`, at a level of its own (sizing.early_level), spent; on `slower` the rounds set
aside at this sample length are taken back to be judged.

Each look reads what it needs of its rounds in one call of stats.look (the estimate, its interval,
the verdict, whether settled) and calls sizing at most once: the statistics stay pure functions,
the state stays here. Time is read from `timer` alone (compare's clock: the tests simulate it).
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from mgpu_perf.gate import sizing
from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.health import RoundFacts, check_rounds
from mgpu_perf.gate.rounds import Pools, SetUp, close_workers, in_both, take_round
from mgpu_perf.gate.settings import Settings

__all__ = ["ARMS", "by_arm", "REFUSAL_LOOKS", "HUNT_LOOKS", "Next", "RoundBuffer", "RoundLoop", "RoundsDone",
           "run_rounds"]

ARMS = ("baseline", "candidate")
REFUSAL_LOOKS = 3  # looks at the noise, each at new rounds, before a benchmark is refused for it
HUNT_LOOKS = 6     # more such looks while the rounds in hand point to a slowdown (their ratio above 1 + T)


def by_arm() -> dict[str, list[float]]:
    """An empty list of times for each arm."""
    return {label: [] for label in ARMS}


class Next(enum.Enum):
    """What a look decides about the rounds after it."""
    GO_ON = "go on"      # the phase's rounds go on, up to its limit
    RESTART = "restart"  # this phase's rounds were set aside: a new phase begins, its rounds from 0
    STOP = "stop"        # no more rounds: refused, settled, or all the rounds asked for are in


@dataclass
class RoundBuffer:
    """The rounds the loop has taken: each round's samples in both arms, and the rounds set aside
    (`pilot`), outside the estimate. Held by one RoundLoop. The pilot keeps the shape ab.json
    writes: {"ops_per_sample", "ops", "samples", "host_samples", "pairs", "facts"}."""
    samples: dict = field(default_factory=by_arm)       # one per round and arm, by the deciding clock
    host_samples: dict = field(default_factory=by_arm)  # host wall time beside
    pairs: list = field(default_factory=list)           # the worker pair of each round
    pilot: dict | None = None                           # rounds set aside (ab.json's shape, above)
    facts: list = field(default_factory=list)           # each round's facts (gate/health.py), where reported

    def add_round(self, pair: int, times: dict, facts: dict | None = None) -> None:
        """One round's samples: {arm: (deciding time, host time)} from its worker pair, and what the
        round health checks (RoundFacts.to_dict), when the round has it."""
        for label, (decided, host) in times.items():
            self.samples[label].append(decided)
            self.host_samples[label].append(host)
        self.pairs.append(pair)
        if facts is not None:
            self.facts.append(facts)

    def set_aside(self, ops: int) -> None:
        """Move the rounds taken so far (of `ops` operations a sample) to the pilot: rounds the sizing
        took as warm-up, or shorter samples than the stretched ones that follow."""
        pilot = self.pilot or {"ops_per_sample": ops, "ops": [], "samples": by_arm(), "host_samples": by_arm(),
                               "pairs": []}
        for key in ("samples", "host_samples"):
            for label in ARMS:
                pilot[key][label] += getattr(self, key)[label]
        pilot["pairs"] += self.pairs
        pilot["ops"] += [ops] * len(self.pairs)
        pilot["facts"] = pilot.get("facts", []) + (self.facts if len(self.facts) == len(self.pairs)
                                                   else [None] * len(self.pairs))
        self.pilot = pilot
        self.samples, self.host_samples, self.pairs, self.facts = by_arm(), by_arm(), [], []

    def take_back(self, ops: int) -> None:
        """Put the rounds set aside that had `ops` operations a sample back among the rounds (before
        them): a refusal look that found `slower` on them all is judged on them all."""
        if not self.pilot:
            return
        keep = [i for i, o in enumerate(self.pilot["ops"]) if o != ops]
        back = [i for i, o in enumerate(self.pilot["ops"]) if o == ops]
        for key in ("samples", "host_samples"):
            for label in ARMS:
                old = self.pilot[key][label]
                getattr(self, key)[label][:0] = [old[i] for i in back]
                self.pilot[key][label] = [old[i] for i in keep]
        self.pairs[:0] = [self.pilot["pairs"][i] for i in back]
        self.pilot["pairs"] = [self.pilot["pairs"][i] for i in keep]
        facts = self.pilot.pop("facts", [None] * len(self.pilot["ops"]))
        if all(facts[i] is not None for i in back) and len(self.facts) + len(back) == len(self.pairs):
            self.facts[:0] = [facts[i] for i in back]
        self.pilot["facts"] = [facts[i] for i in keep]
        self.pilot["ops"] = [self.pilot["ops"][i] for i in keep]
        if not self.pilot["ops"]:
            self.pilot = None

    def pooled_at(self, ops: int, arm: str) -> list[float]:
        """The samples of `arm` in hand, then those set aside that had `ops` operations a sample: what
        a refusal look tests for `slower`."""
        aside = [t for t, o in zip(self.pilot["samples"][arm], self.pilot["ops"]) if o == ops] if self.pilot else []
        return self.samples[arm] + aside

    def rounds_taken(self) -> int:
        """Every round taken, those set aside included."""
        return len(self.samples["baseline"]) + len(self.pilot["samples"]["baseline"] if self.pilot else [])


@dataclass(frozen=True)
class RoundsDone:
    """What one benchmark's loop found, once its workers are closed (run_rounds): what gate/compare.py
    builds its Comparison from. `counted` is what the loop's `count` returned (gate/counted.py)."""
    status: str                  # compared | undecidable (no verdict can be had: `reason` says why)
    reason: str
    ops_per_sample: int
    samples: dict
    host_samples: dict
    pairs: list
    pilot: dict | None
    facts: list
    clock: str
    cpu_applies: bool
    plans: list                  # each first look's sizing (sizing.Plan.to_dict)
    spent: float                 # the level the refusal looks' `slower` tests spent
    early: dict | None           # a refusal look whose rounds already showed `slower`: where, at what level
    estimate: abstats.Estimate   # from the rounds in hand (not those set aside)
    round_s: float               # seconds a round took (both arms), over every round taken
    counted: object              # what the loop's `count` returned (gate/counted.py: a Counted)
    count_s: float               # the seconds it took


@dataclass
class RoundLoop:
    """Where one benchmark's rounds stand: the loop's whole state, its rounds included. Only its own
    methods change it; `plans`, `spent`, `early` and `refusal` are what the looks found."""
    name: str
    pools: Pools
    settings: Settings
    strictest: float         # the level of the strictest Holm step: alpha / the run's benchmarks
    start: float             # the benchmark's start: its budget counts from here, set-up and warm-up included
    timer: Callable[[], float] = time.perf_counter  # what `start` and every phase are timed by
    clock: str = "host"      # the deciding clock, chosen at the warm-up (rounds.choose_clock)
    ops: int = 1             # operations a sample
    op_s: float = math.nan   # seconds an operation, from the warm-up
    cpu_applies: bool = False  # the step runs in the workers' processes on the host clock (gate/health.py)
    limit: int | None = None  # the rounds this phase may take (None: max_rounds); sized at the first look
    taken: int = 0           # the rounds this phase has taken
    phase_began: float = 0.0
    rounds: RoundBuffer = field(default_factory=RoundBuffer)
    stretched: bool = False
    looks_left: int = REFUSAL_LOOKS - 1  # second looks a refusal for noise may still wait for
    hunts_left: int = HUNT_LOOKS         # looks more, where the rounds in hand point to a slowdown
    plans: list = field(default_factory=list)  # each first look's sizing (sizing.Plan.to_dict)
    spent: float = 0.0       # the level the refusal looks' `slower` tests spent
    early: dict | None = None  # a refusal look whose rounds already showed `slower`: where, at what level
    refusal: str | None = None  # why no verdict can be had (`undecidable`), once a look refused
    early_level: float = field(init=False)  # the level of a refusal look's `slower` test (sizing.early_level)

    def __post_init__(self):
        if self.limit is None:
            self.limit = self.settings.max_rounds
        self.early_level = sizing.early_level(self.strictest, REFUSAL_LOOKS + HUNT_LOOKS)

    @property
    def workers(self) -> int:
        return len(self.pools["baseline"])

    @property
    def first_look_at(self) -> int:
        """The phase's rounds at its first look: every worker pair's two rounds, and min_rounds."""
        return max(self.settings.min_rounds, 2 * self.workers)

    def left_s(self, now: float) -> float:
        return self.settings.budget_s - (now - self.start)

    def take_rounds(self, log) -> float:
        """Rounds until the phase's limit, or until a look says STOP; a RESTART begins the phase's
        rounds again. Returns the seconds a round took, over every round taken."""
        settings = self.settings
        began = self.phase_began = self.timer()
        while self.taken < self.limit:
            self.rounds.add_round(*take_round(self.pools, self.taken, self.workers, self.ops, self.clock,
                                              settings.smoke))
            self.taken += 1
            if settings.smoke or self.taken < self.first_look_at:
                continue
            step = self.first_look(log) if self.taken == self.first_look_at else Next.GO_ON
            if step is Next.RESTART:
                continue
            if step is Next.STOP or self.later_look() is Next.STOP:
                break
        return (self.timer() - began) / max(1, self.rounds.rounds_taken())

    def restart(self, ops: int | None = None, limit: int | None = None) -> None:
        """Set this phase's rounds aside and begin a new phase (with `ops` a sample, `limit` rounds)."""
        self.rounds.set_aside(self.ops)
        if ops is not None:
            self.ops = ops
        if limit is not None:
            self.limit = limit
        self.taken, self.phase_began = 0, self.timer()

    def _look(self, level: float, pooled: bool = False) -> abstats.Look:
        """stats.look at this phase's rounds (`pooled`: and those set aside at this sample length)."""
        if pooled:
            base, cand = (self.rounds.pooled_at(self.ops, arm) for arm in ARMS)
        else:
            base, cand = self.rounds.samples["baseline"], self.rounds.samples["candidate"]
        return abstats.look(base, cand, self.settings.threshold, level)

    def _budget(self, now: float) -> sizing.Budget:
        """What sizing sizes within, now: the time a round of this phase took and the time left."""
        s = self.settings
        return sizing.Budget(s.threshold, self.strictest, s.max_rounds, round_s=(now - self.phase_began) / self.taken,
                             sample_s=self.ops * self.op_s, budget_left_s=self.left_s(now), pair_bias=s.pair_bias,
                             workers=self.workers)

    # -- the looks ---------------------------------------------------------------------------------

    def first_look(self, log) -> Next:
        """Size the rest from the first look's rounds (sizing.plan_for). RESTART: the rounds were set
        aside and the phase begins anew (a refusal for noise the budget holds another look for, or
        stretched samples); STOP: no more rounds (refused: `refusal` says why; or all the rounds asked
        for are in); GO_ON: the phase's limit set to the rounds planned."""
        now = self.timer()
        seen = self._look(self.strictest)
        plan = sizing.plan_for(self._budget(now), seen.estimate, may_stretch=not self.stretched)
        self.plans.append(plan.to_dict())
        if plan.action == "refuse":
            step = self._at_a_refusal(plan, seen, now, log)
            if step is not Next.GO_ON:
                return step
        if self.taken >= self.limit:
            return Next.STOP
        if plan.action == "stretch":  # the first rounds' samples are shorter, their noise larger: kept, not mixed in
            self.stretched = True
            self.restart(ops=max(self.ops + 1, math.ceil(self.ops * plan.stretch)), limit=plan.rounds)
            log(f"{self.name}: {plan.message}")
            return Next.RESTART
        self.limit = min(self.limit, max(plan.rounds, self.first_look_at))
        return Next.GO_ON

    def _at_a_refusal(self, plan: sizing.Plan, seen: abstats.Look, now: float, log) -> Next:
        """A first look whose plan refuses: STOP when the rounds in hand already show `slower` (the
        early test), or when no verdict can be had (`refusal` set: `undecidable`); RESTART for another
        look at new rounds; GO_ON when these rounds settled it (or are all the rounds asked for):
        judged on them."""
        threshold, done = self.settings.threshold, self.taken
        under_floor = threshold < plan.floor
        # Do the rounds in hand (this look's and the earlier looks' at this sample length) already show
        # `slower`, too noisy as they are to size a change of the threshold? Tested at early_level, spent
        # (the final test's level is what is left), so a clear slowdown is called at the look where it
        # is clear and `undecidable` means the data could not decide.
        early = None if under_floor else self._look(self.early_level, pooled=True)
        if early is not None:
            self.spent += early.level
            if early.verdict == "slower":
                self.rounds.take_back(self.ops)  # judged on all it tested
                self.early = {"rounds": early.estimate.rounds, "level": early.level, "interval": list(early.interval)}
                log(f"{self.name}: slower already at a refusal look ({early.estimate.rounds} rounds, ratio "
                    f"{early.estimate.ratio:.3f})")
                return Next.STOP
        # Another look only where the budget holds it and as many rounds again after it. Fresh
        # workers' first rounds are often their noisiest, and noisy spells pass within seconds.
        # Past those looks, more while the rounds in hand point to a slowdown (not `slower` yet, but
        # their ratio above 1 + T): each tests them all.
        time_for_look = 2 * (now - self.phase_began) <= self.left_s(now)
        hunt = not self.looks_left and self.hunts_left and early is not None and early.estimate.ratio > 1 + threshold
        if not under_floor and (self.looks_left or hunt) and done < self.limit and time_for_look and not seen.settled:
            if hunt:
                self.hunts_left -= 1
            else:
                self.looks_left -= 1
            self.restart()
            log(f"{self.name}: first rounds too noisy to size ({plan.message}); measuring again")
            return Next.RESTART
        # Under the floor: no verdict, whatever the rounds. Too noisy for the budget: no verdict
        # unless these rounds already settled it (or they are all the rounds asked for).
        if under_floor or (done < self.limit and not seen.settled):
            self.refusal = plan.message
            return Next.STOP
        return Next.GO_ON

    def later_look(self) -> Next:
        """Every look_every rounds from the first look: STOP when the interval is settled before the
        last round and the rounds are not doubted. Only a verdict that cannot be a false `slower` ends
        a benchmark early: looking for `slower` after every few rounds would test it again and again
        (a false alarm rate up to 3x the nominal level, simulated); `slower` is judged once, at the
        end. Past the first look, the phase's limit is resized from all the rounds so far
        (sizing.resized_limit); else GO_ON."""
        done = self.taken
        if done > self.limit or (done - self.first_look_at) % self.settings.look_every:
            return Next.GO_ON
        seen = self._look(self.strictest)
        if done < self.limit and seen.settled and not self.doubted():
            return Next.STOP
        if done > self.first_look_at:
            self.limit = sizing.resized_limit(self._budget(self.timer()), seen.estimate, self.limit, done)
        return Next.GO_ON

    def doubted(self) -> str:
        """Why the rounds so far could not stand as `unchanged` (gate/health.py; "" when they could): a
        settled benchmark whose rounds are doubted is not stopped early but runs the rounds it was
        sized for, so that its verdict rests on more rounds than the doubted ones."""
        facts = [RoundFacts.from_dict(f) for f in self.rounds.facts]
        return check_rounds(self.rounds.samples, facts, self.settings.threshold, self.strictest, self.cpu_applies,
                            self.clock).doubt

    def done(self, round_s: float, counted: object, count_s: float) -> RoundsDone:
        """What the loop found, frozen: the estimate from the rounds in hand."""
        r = self.rounds
        return RoundsDone(
            status="compared" if self.refusal is None else "undecidable", reason=self.refusal or "",
            ops_per_sample=self.ops, samples=r.samples, host_samples=r.host_samples, pairs=r.pairs, pilot=r.pilot,
            facts=r.facts, clock=self.clock, cpu_applies=self.cpu_applies, plans=self.plans, spent=self.spent,
            early=self.early, estimate=abstats.estimate(r.samples["baseline"], r.samples["candidate"],
                                                        self.settings.threshold),
            round_s=round_s, counted=counted, count_s=count_s)


def run_rounds(name: str, pools: Pools, ready: SetUp, settings: Settings, strictest: float, start: float,
               count: Callable[[], object], log=lambda _: None) -> RoundsDone:
    """One benchmark's loop, after the warm-up (`ready`, gate/rounds.py set_up): the step counted in
    both arms (`count`, timed, outside the rounds), the rounds (RoundLoop.take_rounds), then every
    worker's check of its results (a wrong result fails the run, in either arm); every worker is
    closed at the end, whatever happened. `strictest`: the strictest Holm level of the run;
    `start`: when the benchmark's budget began, by time.perf_counter (looked up at the call: a test's
    simulated clock replaces it)."""
    timer = time.perf_counter
    loop = RoundLoop(name, pools, settings, strictest, start, timer=timer, clock=ready.clock, ops=ready.ops,
                     op_s=ready.op_s, cpu_applies=ready.cpu_applies)
    try:
        counting_began = timer()
        counted = count()
        count_s = timer() - counting_began
        round_s = loop.take_rounds(log)
        in_both(pools, "check")  # wrong results fail the run, in either arm
    finally:
        close_workers(pools)
    return loop.done(round_s, counted, count_s)
