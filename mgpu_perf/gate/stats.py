"""The A/B gate's statistics: a paired ratio from per-round log ratios, its interval, a verdict,
and Holm's correction across the gated benchmarks of one run.

Each round times both arms back to back (A B, then B A, ...), so whatever the machine does during
a round (a VM's host busy for a second, a slow minute) hits both arms of that round alike. The
round's log ratio log(candidate / baseline) cancels most of it; the rounds' 20 % trimmed mean of
log ratios estimates the slowdown, and Yuen's interval (the winsorised variance, Student's t with
n - 2g - 1 degrees of freedom, g = floor(0.2 n) rounds trimmed from each end) gives its interval.

Why trimmed: what a round does not cancel (a burst of host load inside one arm's sample) comes as
rounds far off the rest: on this VM the rounds' log ratios have heavy tails (excess kurtosis up to
15 in one decision, rounds 20-50 % off where the middle half lay within 10 %). One such round moves
a mean and widens Student's interval for every round; the trimmed mean drops it. Replayed on the
same 26 recorded 80-round decisions (docs/measure/gate_statistic.py), the trimmed mean caught 8 of
13 slowdowns of 5 % at --ab-threshold 5 (40 rounds; 9 of 13 at 80) where the mean caught 6 (5), with
no false `slower` in 13 either way; validate-gate's rates with it are in docs/perf.md. The trimmed
mean of a symmetric distribution is its centre, and the log ratio of two samples noisy alike is
symmetric about the arms' true difference, so trimming moves no estimate there; it only ignores
outliers. Below 5 rounds nothing is trimmed (a smoke run's 3), and the estimate is the plain mean
with Student's t.

With threshold T (the slowdown the gate exists to catch, default 10 %) and h = log(1 + T/2):

    slower        the interval's lower bound is above +h: slower by more than T/2, with confidence
    faster        the interval's upper bound is below -h
    unchanged     the interval lies inside (-log(1 + T), +log(1 + T)): no change of the threshold's size
    inconclusive  none of these (too few rounds for the noise: add rounds, or a quieter machine)

Testing "slower" against T/2 rather than against 0 is what keeps an unchanged run quiet: two
identical worker processes differ by a few percent for reasons no code change made (memory
layout, which core) and, with enough rounds, a test against 0 would call that significant.
A 10 % slowdown clears T/2 by 5 points, which 20 to 40 rounds resolve at the noise measured
here (docs/perf.md). One-sided tests at level alpha; across k benchmarks Holm's step-down keeps
the chance of any false `slower` in a whole run at alpha.

gate/compare.py may stop a benchmark early only when it is `settled`: its interval lies inside
(1/(1 + T/2), 1 + T/2), clear of a slowdown of half the threshold, or it is `faster`. The
`unchanged` margin of the final verdict, 1 + T, is too wide to stop on: a true slowdown of T whose
first rounds happened to measure low stopped there as `unchanged` (1 run in 10 at
--ab-threshold 5, docs/perf.md). `slower` is tested once, on all its rounds.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass


def _t():
    """Student's t from scipy, imported when first needed: most pytest runs that load the plugin
    judge nothing, and scipy.stats takes about 0.6 s to import."""
    from scipy.stats import t

    return t


@functools.lru_cache(maxsize=4096)
def _t_quantile(q: float, df: int) -> float:
    """Student's t quantile, remembered: the sizing asks for the same few hundred (level, df) pairs
    again at every look (scipy's ppf costs about 0.1 ms a call; sizing was most of a simulated
    gate run's time)."""
    return float(_t().ppf(q, df))

__all__ = ["Estimate", "estimate", "trimmed_mean", "verdict", "settled", "holm_levels", "decide", "VERDICTS",
           "round_noise", "noise_low", "rounds_needed", "smallest_detectable", "threshold_floor", "pair_spread", "Plan", "plan",
           "workers_for", "averaged_bias", "rounds_to_run", "PAIR_BIAS", "POWER_Z", "FLOOR_SDS", "BIAS_SHARE", "MAX_WORKERS", "percent"]

VERDICTS = ("slower", "faster", "unchanged", "inconclusive", "undecidable")


TRIM = 0.2  # the fraction of rounds trimmed from each end of the sorted log ratios (Yuen's usual 20 %)


@dataclass(frozen=True)
class Estimate:
    rounds: int
    mean_log_ratio: float   # the rounds' trimmed mean of log(candidate / baseline) (plain mean below 5 rounds)
    se: float               # its standard error (Yuen's, from the winsorised variance)
    p_slower: float         # one-sided p-value of "slower by more than T/2" (H0: ratio <= 1 + T/2)
    df: int | None = None   # degrees of freedom of its t: rounds - 2 * trimmed - 1 (None: rounds - 1)

    @property
    def ratio(self) -> float:
        return math.exp(self.mean_log_ratio)

    @property
    def dof(self) -> int:
        return self.df if self.df is not None else self.rounds - 1

    def interval(self, alpha: float) -> tuple[float, float]:
        """The ratio's (1 - 2 alpha) interval: each bound a one-sided bound at level alpha."""
        if self.rounds < 2 or self.dof < 1 or not math.isfinite(self.se):
            return 0.0, math.inf
        t = _t().ppf(1 - alpha, self.dof) if self.se > 0 else 0.0
        return math.exp(self.mean_log_ratio - t * self.se), math.exp(self.mean_log_ratio + t * self.se)

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def _half(threshold: float) -> float:
    return math.log1p(threshold / 2)


def estimate(baseline: list[float], candidate: list[float], threshold: float, trim: float = TRIM) -> Estimate:
    """The paired estimate from one sample per arm per round (times, seconds). `trim=0`: the rounds'
    plain mean and Student's t (the gate's statistic before the trimmed mean; docs/measure compares them)."""
    if len(baseline) != len(candidate):
        raise ValueError(f"paired samples need as many baseline as candidate rounds ({len(baseline)} != {len(candidate)})")
    if any(not (t > 0 and math.isfinite(t)) for t in (*baseline, *candidate)):
        raise ValueError("every sample must be a positive, finite time")
    logs = [math.log(c / b) for b, c in zip(baseline, candidate)]
    n = len(logs)
    mean, se, df = trimmed_mean(logs, trim)
    if n < 2:
        p = 1.0
    elif se == 0:
        p = 0.0 if mean > _half(threshold) else 1.0
    else:
        p = float(_t().sf((mean - _half(threshold)) / se, df))
    return Estimate(rounds=n, mean_log_ratio=mean, se=se, p_slower=p, df=df)


def trimmed_mean(values: list[float], trim: float = TRIM) -> tuple[float, float, int]:
    """(trimmed mean, Yuen's standard error, degrees of freedom) of one sample: g = floor(trim n)
    values cut from each end (none below 5 values); the error from the winsorised sample (those g
    set to the nearest kept value) as sqrt((n - 1) s_w^2 / (h (h - 1))), h = n - 2g kept, with h - 1
    degrees of freedom. With g = 0 it is the mean, its standard error and n - 1. (scipy.stats has
    Yuen's test only for two independent samples, `ttest_ind(trim=)`; the rounds here are paired,
    one log ratio each.) `trim` in [0, 0.4): from 0.4 on, 5 values would keep 1 (no error to take)."""
    if not 0 <= trim < 0.4:
        raise ValueError(f"trim must be a fraction in [0, 0.4), got {trim}")
    n = len(values)
    if n == 0:
        return math.nan, math.inf, 0
    g = int(trim * n) if n >= 5 else 0
    ordered = sorted(values)
    kept = ordered[g:n - g]
    h = len(kept)
    mean = statistics.fmean(kept)
    if n < 2:
        return mean, math.inf, 0
    winsorised = [min(max(v, kept[0]), kept[-1]) for v in ordered]
    se = math.sqrt((n - 1) * statistics.variance(winsorised) / (h * (h - 1)))
    return mean, se, h - 1


def verdict(est: Estimate, threshold: float, alpha: float) -> str:
    """`slower`, `faster`, `unchanged` or `inconclusive` at level alpha (see the module docstring)."""
    low, high = est.interval(alpha)
    half, full = 1 + threshold / 2, 1 + threshold
    if low > half:
        return "slower"
    if high < 1 / half:
        return "faster"
    if low > 1 / full and high < full:
        return "unchanged"
    return "inconclusive"


def settled(est: Estimate, threshold: float, alpha: float) -> bool:
    """True when more rounds cannot make the benchmark `slower` at this level: its interval lies
    inside (1/(1 + T/2), 1 + T/2), or below 1/(1 + T/2) (`faster`). What may stop it early."""
    low, high = est.interval(alpha)
    half = 1 + threshold / 2
    return high < half and (low > 1 / half or high < 1 / half)


def holm_levels(p_values: list[float], alpha: float) -> list[float]:
    """Holm's step-down: the level each test is judged at, in the order given. Sorted by p-value,
    the i-th smallest (from 0) gets alpha / (k - i) while every smaller one was rejected; after the
    first that is not, the rest keep alpha / k' of that step (none of them can be rejected)."""
    k = len(p_values)
    if k == 0:
        return []
    order = sorted(range(k), key=lambda i: p_values[i])
    levels = [alpha / k] * k
    for step, i in enumerate(order):
        levels[i] = alpha / (k - step)
        if p_values[i] > levels[i]:
            for j in order[step + 1:]:
                levels[j] = levels[i]
            break
    return levels


def decide(estimates: list[Estimate], threshold: float, alpha: float) -> list[tuple[str, float]]:
    """(verdict, level) of every benchmark of one run, Holm-corrected across them."""
    levels = holm_levels([e.p_slower for e in estimates], alpha)
    return [(verdict(e, threshold, level), level) for e, level in zip(estimates, levels)]


# -- the noise floor: can this threshold be decided at all, and at what sample length ---------------
#
# What a benchmark's first rounds tell before any verdict: the rounds' noise (the spread of their log
# ratios) and, from it, how many rounds a change of the threshold's size needs. The gate sizes its
# run by it (gate/compare.py): it goes on as asked, stretches the samples, or says at once that the
# threshold cannot be decided in the budget, with the figures, instead of spending the budget and
# ending `inconclusive`. Below all of that lies the floor set by the worker processes themselves:
# two processes of one tree time it a little differently for all their rounds (docs/perf.md: an sd
# of 1-1.6 % from one pair to the next on the 2-core VM), so a threshold whose half is not well
# clear of that bias cannot be judged with any number of rounds.

POWER_Z = 1.2816   # the power asked of a change of exactly the threshold: 90 % (one-sided normal quantile)
PAIR_BIAS = 0.015  # sd of one pair of worker processes' bias (log ratio); the top of docs/perf.md's 1-1.6 %
FLOOR_SDS = 2.0    # T/2 must be this many sds of the (averaged) pair bias: else the bias alone can reach it
BIAS_SHARE = 0.5   # the auto worker count keeps the pairs' bias, at the power asked, within this share of the margin
MAX_WORKERS = 8    # worker processes an arm at most (each holds the workload: a model, a pool of ranks)
SPARE = 1.5        # rounds run = this many times the rounds needed: the first look measures the noise roughly


def round_noise(est: Estimate) -> float:
    """The noise of one round's log ratio as the estimate sees it: its standard error times the
    square root of its rounds (for the trimmed mean, Yuen's error already counts the trimming).
    So that se(n) = noise / sqrt(n) predicts the error after n rounds of the same kind."""
    if est.rounds < 2 or not math.isfinite(est.se):
        return math.inf
    return est.se * math.sqrt(est.rounds)


def noise_low(est: Estimate, confidence: float = 0.8) -> float:
    """A lower confidence bound of round_noise (chi-square on the estimate's degrees of freedom):
    what the sizing rule decides by. Ten rounds measure the noise roughly (5 % of the time 1.6
    times too high), and a benchmark refused or stretched on a high draw would lose its verdict or
    time for nothing; one sized on a low draw ends `inconclusive`, as it did before the rule."""
    noise = round_noise(est)
    if not math.isfinite(noise):
        return noise
    from scipy.stats import chi2

    return noise * math.sqrt(est.dof / float(chi2.ppf(confidence, est.dof)))


def _margin(threshold: float) -> float:
    """How far a change of exactly the threshold lies above the `slower` bound T/2 (log)."""
    return math.log1p(threshold) - math.log1p(threshold / 2)


def _df(rounds: int) -> int:
    """Degrees of freedom of the trimmed mean of `rounds` log ratios (gate: trimmed_mean)."""
    g = int(TRIM * rounds) if rounds >= 5 else 0
    return max(1, rounds - 2 * g - 1)


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
    z_alpha = _t_quantile(1 - alpha, 10_000)
    n = max(3, int(((z_alpha + power_z) * noise / margin) ** 2 * 0.9))  # a start below the answer
    while n <= most:
        if _used(noise / math.sqrt(n), bias, _t_quantile(1 - alpha, _df(n)), power_z) <= margin:
            return n
        n += max(1, n // 50)
    return most + 1


def smallest_detectable(noise: float, rounds: int, alpha: float, power_z: float = POWER_Z, bias: float = 0.0) -> float:
    """The smallest threshold T (a fraction) that `rounds` rounds of this noise decide with the power
    asked: log(1 + T) - log(1 + T/2) = m with m the margin used (_used), so
    T = (e^m - 1) / (1 - e^m / 2); inf where no threshold is (m >= log 2)."""
    if rounds < 2 or not math.isfinite(noise):
        return math.inf
    m = _used(noise / math.sqrt(rounds), bias, _t_quantile(1 - alpha, _df(rounds)), power_z)
    e = math.exp(m)
    return (e - 1) / (1 - e / 2) if e < 2 else math.inf


def averaged_bias(pair_bias: float, workers: int) -> float:
    """The sd of the bias the arms' worker pairs bring to an estimate whose rounds go to `workers`
    pairs in turn (compare.round_pair): one pair's sd over sqrt(workers)."""
    return pair_bias / math.sqrt(max(1, workers))


def workers_for(threshold: float, pair_bias: float = PAIR_BIAS, power_z: float = POWER_Z,
                share: float = BIAS_SHARE, most: int = MAX_WORKERS) -> int:
    """Worker processes an arm when none is asked for: the fewest whose averaged pair bias, at the
    power asked, uses at most `share` of the margin a change of the threshold has over T/2, leaving
    the rest to the rounds' noise (rounds_needed). With 1.5 %: 1 at 10 %, 2 at 7 %, 3 at 5 %.
    Measured (docs/gate.md): at 5 % two workers an arm caught 16 of 20 slowdowns of 5 %, two of
    the misses `unchanged` at 1.035, a pair of processes timing the slower tree 5 points low."""
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
        finite = (lambda x: x if math.isfinite(x) else None)
        return {"action": self.action, "noise": finite(self.noise), "floor": self.floor,
                "rounds_needed": self.rounds_needed, "rounds_allowed": self.rounds_allowed, "rounds": self.rounds,
                "stretch": self.stretch, "smallest_detectable": finite(self.smallest), "message": self.message}


def percent(x: float) -> str:
    """A fraction as the reports write it: 0.0429 as 4.3 %, 0.126 as 13 %."""
    return f"{x * 100:.2g} %" if x < 0.1 else f"{x * 100:.0f} %"


def plan(noise: float, threshold: float, alpha: float, max_rounds: int, round_s: float, sample_s: float,
         budget_left_s: float, pair_bias: float = PAIR_BIAS, workers: int = 1, max_sample_s: float = 60.0,
         may_stretch: bool = True, power_z: float = POWER_Z, low: float | None = None, at_least: int = 40,
         spare: float = SPARE) -> Plan:
    """The sizing rule. `noise`: per-round log-ratio noise of the first rounds; `round_s`: seconds a
    round took (both arms, overheads included); `sample_s`: seconds of work in one of its samples.
    A sample k times as long is taken to have noise / sqrt(k) (independent steps; on the H200 of
    docs/gpu.md, samples 4 times as long narrowed the interval about 2 times) and a round k times
    round_s. Returns:
    - refuse, when the threshold lies under the worker pairs' floor (whatever the rounds), or when
      no sample length fits the rounds it needs into the time left;
    - go, when the rounds it needs fit max_rounds (and the time left) at this length: as asked;
    - stretch, to the shortest sample length whose rounds fit.
    A benchmark runs `spare` times the rounds it needs (the noise of 10 rounds is rough: 1.5 times
    covers noise 1.22 times the figure measured), at least `at_least` (40: the rounds of the rates
    measured at 10 %), within max_rounds and the time left. More rounds come before longer samples:
    they keep the rounds already taken (a stretch starts again), and on the 2-core VM longer samples
    bought no more per second of rounds (docs/gate.md section 4: noise squared times seconds a round
    was 1.4-1.9 for samples of one step, 2.5-4.7 for 3 steps, 2.0-7.8 for 6-12 steps, two runs).
    Sized by `noise`; `low` (noise_low: a lower bound) decides only whether to refuse. The worker
    pairs' averaged bias (averaged_bias) takes its share of the margin in every count of rounds."""
    low = noise if low is None else low
    floor = threshold_floor(pair_bias, workers)
    bias = averaged_bias(pair_bias, workers)
    noise_text = f"noise {percent(math.expm1(noise)) if math.isfinite(noise) else 'unmeasurable'} a round"

    def allowed(k: float) -> int:
        return max(0, min(max_rounds, int(budget_left_s / max(round_s * k, 1e-9))))

    def needed(n: float) -> int:
        return rounds_needed(n, threshold, alpha, power_z, bias=bias)

    def rounds(k: float, sized_by: float) -> int:
        wanted = rounds_to_run(sized_by / math.sqrt(k), threshold, alpha, pair_bias, workers, spare, power_z)
        return min(allowed(k), max(at_least, wanted))

    need = needed(noise)
    k_best = max(1.0, min(max_sample_s / sample_s, budget_left_s / max(round_s * max_rounds, 1e-9)))
    smallest = max(floor, smallest_detectable(noise / math.sqrt(k_best), allowed(k_best), alpha, power_z, bias))
    base = dict(noise=noise, floor=floor, rounds_needed=need, rounds_allowed=allowed(1.0), smallest=smallest)
    if threshold < floor:
        return Plan("refuse", rounds=0, message=(
            f"threshold {percent(threshold)} is under the floor of {percent(floor)} that worker processes set, "
            f"whatever the rounds ({noise_text}; two processes of one tree differ by about {percent(pair_bias)} sd a "
            f"pair, {workers} pair(s) averaged): use a threshold of at least {percent(floor)}, more workers an arm, "
            "or the pair bias calibrate measures here"),
            **base)
    # Sized by the noise measured: a run sized on a low draw of its first rounds ends short of the
    # power asked (at 5 %, two decisions in 20 sized `go` at 1.9-2.5 % went on at 5.5 % and ended
    # `unchanged`, docs/gate.md). Too long a stretch only takes longer; only a refusal, which loses
    # the verdict, waits for the noise's lower bound to say that no sample length fits.
    def stretch(sized_by: float) -> Plan | None:
        k = max(1.0, needed(sized_by) / max_rounds)
        while may_stretch and k <= max_sample_s / sample_s:
            if needed(sized_by / math.sqrt(k)) <= allowed(k):
                return Plan("stretch", rounds=rounds(k, sized_by), stretch=k, **base, message=(
                    f"{noise_text}: {percent(threshold)} needs about {need} rounds of {sample_s:.2g} s; samples "
                    f"stretched to {sample_s * k:.2g} s"))
            k *= 1.1
        return None

    if need <= allowed(1.0):
        return Plan("go", rounds=rounds(1.0, noise), **base)
    sized = stretch(noise)
    if sized is None and needed(low) <= allowed(1.0):
        sized = Plan("go", rounds=allowed(1.0), **base)  # the lower bound fits: all the rounds allowed may decide it
    sized = sized or stretch(low)
    if sized is not None:
        return sized
    suggested = workers_for(threshold, pair_bias, power_z)
    more = (f"; {suggested} workers an arm (the auto count) would leave the rounds more of the margin the worker "
            "pairs' bias takes" if suggested > workers else "")
    return Plan("refuse", rounds=0, **base, message=(
        f"{noise_text}: {percent(threshold)} needs about {need} rounds of {sample_s:.2g} s; the budget allows "
        f"{allowed(1.0)}; " + (f"the smallest change it can call in the budget is about {percent(smallest)}"
                                if math.isfinite(smallest) else "no change can be called in the time left")
        + ("" if smallest != floor else " (the worker pairs' floor)") + more))
