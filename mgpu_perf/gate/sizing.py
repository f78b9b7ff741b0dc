"""The A/B gate's sizing rule: what a benchmark's first rounds tell before any verdict. From the
rounds' noise (the per-round spread of their log ratios) it follows how many rounds a change of the
threshold's size needs; the gate then goes on as asked, stretches the samples, or says at once
that the threshold cannot be decided in the budget (`undecidable`), with the figures, instead of
spending the budget and ending `inconclusive`.

Below all of that lies the floor set by the worker processes themselves: two processes of one tree
time it a little differently for all their rounds (--ab-pair-bias, an sd of about 1.5 % from one
pair to the next), so a threshold whose half is not well clear of that bias cannot be judged with
any number of rounds. The rule and its constants: docs/design/gate-statistics.md, "The sizing
rule" and "The floor that worker processes set".

    budget = sizing.Budget(threshold, alpha, max_rounds, round_s, sample_s, budget_left_s, workers=2)
    plan = sizing.plan(budget, noise)
    plan.action      # go | stretch | refuse, with plan.rounds, plan.stretch and plan.message
    plan = sizing.plan_for(budget, estimate)           # the same from a first look's rounds
    limit = sizing.resized_limit(budget, estimate, limit, done)   # a later look's: never fewer rounds
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

from mgpu.jsonsafe import finite_or_none
from mgpu_perf.gate.stats import Estimate, degrees_of_freedom

__all__ = ["early_level", "PAIR_BIAS", "POWER_Z", "FLOOR_SDS", "BIAS_SHARE", "MAX_WORKERS", "SPARE", "round_noise", "noise_low",
           "rounds_needed", "smallest_detectable", "averaged_bias", "workers_for", "rounds_to_run", "threshold_floor",
           "pair_spread", "Plan", "Budget", "plan", "plan_for", "resized_limit", "percent"]

POWER_Z = 1.2816   # the power asked of a change of exactly the threshold: 90 % (one-sided normal quantile)
PAIR_BIAS = 0.015  # sd of one pair of worker processes' bias: --ab-pair-bias's default (gate/settings.py declares it so)
FLOOR_SDS = 2.0    # T/2 must be this many sds of the (averaged) pair bias: else the bias alone can reach it
BIAS_SHARE = 0.5   # the auto worker count keeps the pairs' bias, at the power asked, within this share of the margin
MAX_WORKERS = 8    # worker processes an arm at most (each holds the workload: a model, a pool of ranks)
SPARE = 1.5        # rounds run = this many times the rounds needed: the first look measures the noise roughly
AT_LEAST = 40      # rounds a benchmark runs at least, once sized (the rounds of the rates measured at 10 %)


def round_noise(est: Estimate) -> float:
    """The noise of one round's log ratio as the estimate sees it: its standard error times the
    square root of its rounds (for the trimmed mean, Yuen's error already counts the trimming).
    So that se(n) = noise / sqrt(n) predicts the error after n rounds of the same kind."""
    if est.rounds < 2 or not math.isfinite(est.se):
        return math.inf
    return est.se * math.sqrt(est.rounds)


def noise_low(est: Estimate, confidence: float = 0.8) -> float:
    """A lower confidence bound of round_noise (chi-square on the estimate's degrees of freedom):
    what decides a refusal. Ten rounds measure the noise roughly (5 % of the time 1.6 times too
    high), and a benchmark refused on a high draw would lose its verdict for nothing."""
    noise = round_noise(est)
    if not math.isfinite(noise):
        return noise
    from scipy.stats import chi2

    return noise * math.sqrt(est.dof / float(chi2.ppf(confidence, est.dof)))


def _margin(threshold: float) -> float:
    """How far a change of exactly the threshold lies above the `slower` bound T/2 (log)."""
    return math.log1p(threshold) - math.log1p(threshold / 2)


@functools.lru_cache(maxsize=4096)
def _t_at(alpha: float, rounds: int) -> float:
    """The one-sided t quantile at level alpha of the trimmed mean of `rounds` log ratios, remembered:
    rounds_needed asks for a few hundred at each look. Student's t from scipy here, as noise_low's
    chi-square: the sizing's arithmetic asks nothing of stats but the test's degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(1 - alpha, max(1, degrees_of_freedom(rounds))))


def _used(se: float, bias: float, t: float, power_z: float) -> float:
    """How much of the margin a decision of standard error `se` uses, its verdict at level alpha (t)
    with the power asked (power_z), when the worker pairs add an averaged bias of sd `bias` that
    the rounds' interval does not see: the interval's half-width t se, plus power_z sds of what
    the estimate varies by from one run to the next, sqrt(bias^2 + se^2)."""
    return t * se + power_z * math.sqrt(bias * bias + se * se)


def rounds_needed(noise: float, threshold: float, alpha: float, power_z: float = POWER_Z, most: int = 100_000,
                  bias: float = 0.0) -> int:
    """The fewest rounds at which a change of exactly the threshold is called `slower` with the
    power asked (90 %) at level alpha, for rounds of this noise: t noise / sqrt(n) + z sqrt(bias^2 +
    noise^2 / n) <= log(1 + T) - log(1 + T/2), `bias` the sd of the worker pairs' averaged bias
    (averaged_bias; 0: none). `most` + 1 when even `most` rounds are not enough (or noise is inf,
    or the bias alone leaves no room: z bias >= the margin)."""
    if not math.isfinite(noise):
        return most + 1
    margin = _margin(threshold)
    if power_z * bias >= margin:
        return most + 1
    from scipy.stats import t

    z_alpha = float(t.ppf(1 - alpha, 10_000))
    n = max(3, int(((z_alpha + power_z) * noise / margin) ** 2 * 0.9))  # a start below the answer
    while n <= most:
        if _used(noise / math.sqrt(n), bias, _t_at(alpha, n), power_z) <= margin:
            return n
        n += max(1, n // 50)
    return most + 1


def smallest_detectable(noise: float, rounds: int, alpha: float, power_z: float = POWER_Z, bias: float = 0.0) -> float:
    """The smallest threshold T (a fraction) that `rounds` rounds of this noise decide with the power
    asked: log(1 + T) - log(1 + T/2) = m with m the margin used (_used), so
    T = (e^m - 1) / (1 - e^m / 2); inf where no threshold is (m >= log 2)."""
    if rounds < 2 or not math.isfinite(noise):
        return math.inf
    m = _used(noise / math.sqrt(rounds), bias, _t_at(alpha, rounds), power_z)
    e = math.exp(m)
    return (e - 1) / (1 - e / 2) if e < 2 else math.inf


def averaged_bias(pair_bias: float, workers: int) -> float:
    """The sd of the bias the arms' worker pairs bring to an estimate whose rounds go to `workers`
    pairs in turn (rounds.round_pair): one pair's sd over sqrt(workers)."""
    return pair_bias / math.sqrt(max(1, workers))


def workers_for(threshold: float, pair_bias: float = PAIR_BIAS, power_z: float = POWER_Z,
                share: float = BIAS_SHARE, most: int = MAX_WORKERS) -> int:
    """Worker processes an arm when none is asked for: the fewest whose averaged pair bias, at the
    power asked, uses at most `share` of the margin a change of the threshold has over T/2, leaving
    the rest to the rounds' noise (rounds_needed). With 1.5 %: 1 at 10 %, 2 at 7 %, 3 at 5 %."""
    for workers in range(1, most + 1):
        if power_z * averaged_bias(pair_bias, workers) <= share * _margin(threshold):
            return workers
    return most


def rounds_to_run(noise: float, threshold: float, alpha: float, pair_bias: float = PAIR_BIAS, workers: int = 1,
                  spare: float = None, power_z: float = POWER_Z) -> int:
    """The rounds a benchmark of this noise runs: `spare` (SPARE) times rounds_needed with the
    worker pairs' averaged bias (what plan's `go` runs, before its floor of 40 and its caps)."""
    need = rounds_needed(noise, threshold, alpha, power_z, bias=averaged_bias(pair_bias, workers))
    return math.ceil((SPARE if spare is None else spare) * need)


def threshold_floor(pair_bias: float, workers: int, sds: float = FLOOR_SDS) -> float:
    """The smallest threshold worker processes let the gate judge: T/2 must be `sds` standard
    deviations of the bias the arms' worker pairs bring (one pair's sd `pair_bias`, averaged over
    `workers` pairs: / sqrt(workers)). With 1.5 %: 6.1 % with one worker an arm, 4.3 % with two."""
    return 2 * math.expm1(sds * pair_bias / math.sqrt(max(1, workers)))


def pair_spread(logs: list[float], pairs: list[int]) -> float | None:
    """The bias of one worker pair against another, measured from a run's rounds: the sd of the
    pairs' mean log ratios less what their rounds' own noise puts into it. None with fewer than 2
    pairs of 2 rounds each. Rough with few pairs (2 pairs: one degree of freedom): reported, and
    used by calibrate with more pairs, not used to refuse a run."""
    groups: dict[int, list[float]] = {}
    for value, pair in zip(logs, pairs):
        groups.setdefault(pair, []).append(value)
    if len(groups) < 2 or any(len(g) < 2 for g in groups.values()):
        return None
    means = [statistics.fmean(g) for g in groups.values()]
    own = statistics.fmean(statistics.variance(g) / len(g) for g in groups.values())
    return math.sqrt(max(0.0, statistics.variance(means) - own))


def percent(x: float) -> str:
    """A fraction as the reports write it: 0.0429 as 4.3 %, 0.126 as 13 %."""
    return f"{x * 100:.2g} %" if x < 0.1 else f"{x * 100:.0f} %"


# -- the plan: go, stretch or refuse -----------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """What a benchmark's first rounds decide about the rest (gate/compare.py)."""
    action: str              # go (as asked) | stretch (longer samples) | refuse (no verdict: the message says why)
    noise: float             # per-round log-ratio noise at the sample length measured
    floor: float             # the smallest threshold the worker pairs allow
    rounds_needed: int       # at the sample length measured
    rounds_allowed: int      # at that length, within max_rounds and the time left
    rounds: int              # the rounds to run from here (at the stretched length, if stretched)
    stretch: float = 1.0     # the samples' new length / the measured one
    smallest: float = math.inf  # the smallest threshold decidable in the time left (best sample length)
    message: str = ""

    def to_dict(self) -> dict:
        return {"action": self.action, "noise": finite_or_none(self.noise), "floor": self.floor,
                "rounds_needed": self.rounds_needed, "rounds_allowed": self.rounds_allowed, "rounds": self.rounds,
                "stretch": self.stretch, "smallest_detectable": finite_or_none(self.smallest),
                "message": self.message}


@dataclass(frozen=True)
class Budget:
    """What plan sizes within, besides the noise: the threshold and level, the cap on rounds, the
    time a round takes and the time left, the worker pairs, and the rule's constants."""
    threshold: float
    alpha: float
    max_rounds: int
    round_s: float           # seconds a round took (both arms, overheads included)
    sample_s: float          # seconds of work in one of its samples
    budget_left_s: float
    pair_bias: float = PAIR_BIAS
    workers: int = 1
    max_sample_s: float = 60.0
    power_z: float = POWER_Z
    at_least: int = AT_LEAST
    spare: float = SPARE

    @property
    def bias(self) -> float:
        return averaged_bias(self.pair_bias, self.workers)

    def allowed(self, k: float) -> int:
        """Rounds of samples k times as long that fit max_rounds and the time left."""
        return max(0, min(self.max_rounds, int(self.budget_left_s / max(self.round_s * k, 1e-9))))

    def needed(self, noise: float) -> int:
        return rounds_needed(noise, self.threshold, self.alpha, self.power_z, bias=self.bias)

    def to_run(self, k: float, sized_by: float) -> int:
        """The rounds to run at samples k times as long, sized by noise `sized_by` at the length measured."""
        wanted = rounds_to_run(sized_by / math.sqrt(k), self.threshold, self.alpha, self.pair_bias, self.workers,
                               self.spare, self.power_z)
        return min(self.allowed(k), max(self.at_least, wanted))

    def smallest(self, noise: float, floor: float) -> float:
        """The smallest threshold decidable in the time left, at the longest samples allowed."""
        k = max(1.0, min(self.max_sample_s / self.sample_s, self.budget_left_s / max(self.round_s * self.max_rounds, 1e-9)))
        return max(floor, smallest_detectable(noise / math.sqrt(k), self.allowed(k), self.alpha, self.power_z,
                                              self.bias))


def plan(budget: Budget, noise: float, low: float | None = None, may_stretch: bool = True) -> Plan:
    """The sizing rule, within `budget` (the threshold, the level, the time a round takes and the
    time left). `noise`: per-round log-ratio noise of the first rounds. A sample k times as long is
    taken to have noise / sqrt(k) and a round k times budget.round_s. Returns:
    - refuse, when the threshold lies under the worker pairs' floor (whatever the rounds), or when
      no sample length fits the rounds it needs into the time left;
    - go, when the rounds it needs fit max_rounds (and the time left) at this length: as asked;
    - stretch (where `may_stretch`), to the shortest sample length whose rounds fit.
    A benchmark runs `spare` times the rounds it needs, at least `at_least`, within max_rounds and
    the time left. More rounds come before longer samples: they keep the rounds already taken.
    Sized by `noise`; `low` (noise_low: a lower bound) decides only whether to refuse. The worker
    pairs' averaged bias (averaged_bias) takes its share of the margin in every count of rounds."""
    b = budget
    low = noise if low is None else low
    floor = threshold_floor(b.pair_bias, b.workers)
    need = b.needed(noise)
    figures = dict(noise=noise, floor=floor, rounds_needed=need, rounds_allowed=b.allowed(1.0),
                   smallest=b.smallest(noise, floor))
    if b.threshold < floor:
        return Plan("refuse", rounds=0, message=_under_the_floor(b, noise, floor), **figures)
    if need <= b.allowed(1.0):
        return Plan("go", rounds=b.to_run(1.0, noise), **figures)
    # Sized by the noise measured; only a refusal, which loses the verdict, waits for the noise's
    # lower bound to say that no sample length fits.
    sized = _stretched(b, noise, need, figures) if may_stretch else None
    if sized is None and b.needed(low) <= b.allowed(1.0):
        sized = Plan("go", rounds=b.allowed(1.0), **figures)  # the lower bound fits: all the rounds allowed may decide it
    if sized is None and may_stretch:
        sized = _stretched(b, low, need, figures)
    return sized or Plan("refuse", rounds=0, message=_too_noisy(b, noise, need, figures["smallest"], floor),
                         **figures)


def plan_for(budget: Budget, est: Estimate, may_stretch: bool = True) -> Plan:
    """plan() for the rounds of `est` (a first look's): sized by their noise (round_noise), whose
    lower bound (noise_low) alone may refuse them."""
    return plan(budget, round_noise(est), low=noise_low(est), may_stretch=may_stretch)


def resized_limit(budget: Budget, est: Estimate, limit: int, done: int) -> int:
    """The rounds to run, looked at again from all the `done` rounds so far (`est`) at a later look:
    more, within max_rounds and what fits in the time left (at budget.round_s a round), when the
    noise has grown since the first look sized the run (rounds_to_run); never fewer than `limit`.
    Only the noise sets it, never the ratio, and `slower` is still tested once, at the end."""
    fits = done + int(max(0.0, budget.budget_left_s) / max(budget.round_s, 1e-9))
    want = rounds_to_run(round_noise(est), budget.threshold, budget.alpha, budget.pair_bias, budget.workers)
    return max(limit, min(want, budget.max_rounds, fits))


def _stretched(b: Budget, sized_by: float, need: int, figures: dict) -> Plan | None:
    """The shortest sample length (k times the measured one, k growing by 10 %) whose rounds fit,
    sized by noise `sized_by`; None when none up to max_sample_s does."""
    k = max(1.0, b.needed(sized_by) / b.max_rounds)
    while k <= b.max_sample_s / b.sample_s:
        if b.needed(sized_by / math.sqrt(k)) <= b.allowed(k):
            return Plan("stretch", rounds=b.to_run(k, sized_by), stretch=k, **figures, message=(
                f"{_noise_text(figures['noise'])}: {percent(b.threshold)} needs about {need} rounds of "
                f"{b.sample_s:.2g} s; samples stretched to {b.sample_s * k:.2g} s"))
        k *= 1.1
    return None


def _noise_text(noise: float) -> str:
    return f"noise {percent(math.expm1(noise)) if math.isfinite(noise) else 'unmeasurable'} a round"


def _under_the_floor(b: Budget, noise: float, floor: float) -> str:
    return (f"threshold {percent(b.threshold)} is under the floor of {percent(floor)} that worker processes set, "
            f"whatever the rounds ({_noise_text(noise)}; two processes of one tree differ by about "
            f"{percent(b.pair_bias)} sd a pair, {b.workers} pair(s) averaged): use a threshold of at least "
            f"{percent(floor)}, more workers an arm, or the pair bias calibrate measures here")


def _too_noisy(b: Budget, noise: float, need: int, smallest: float, floor: float) -> str:
    suggested = workers_for(b.threshold, b.pair_bias, b.power_z)
    more = (f"; {suggested} workers an arm (the auto count) would leave the rounds more of the margin the worker "
            "pairs' bias takes" if suggested > b.workers else "")
    return (f"{_noise_text(noise)}: {percent(b.threshold)} needs about {need} rounds of {b.sample_s:.2g} s; the "
            f"budget allows {b.allowed(1.0)}; "
            + (f"the smallest change it can call in the budget is about {percent(smallest)}"
               if math.isfinite(smallest) else "no change can be called in the time left")
            + ("" if smallest != floor else " (the worker pairs' floor)") + more)


def early_level(strictest: float, looks: int) -> float:
    """The level of a `slower` test at one of a benchmark's `looks` refusal looks: together they
    spend at most half the strictest Holm level (Bonferroni over the looks, valid whatever their
    rounds share), and the final test keeps the rest, so the chance of any false `slower` stays
    within the level at every look; an early `slower` also holds at the final test's level."""
    return strictest / (2 * looks)
