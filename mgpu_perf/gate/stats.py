"""The A/B gate's statistics, numbers only: the paired estimate of a slowdown from per-round log
ratios, its interval, the verdict, and Holm's correction across the gated benchmarks of one run.
How many rounds to take, and whether a threshold can be decided at all, is gate/sizing.py.

Each round times both arms back to back, so whatever the machine does during a round hits both
arms of that round alike, and the round's log ratio log(candidate / baseline) cancels most of it.
The estimate is the rounds' 20 % trimmed mean of log ratios, with Yuen's interval: the winsorised
variance and Student's t on n - 2g - 1 degrees of freedom, g = floor(0.2 n) rounds trimmed from
each end. Below 5 rounds nothing is trimmed (a smoke run's 3): the plain mean with Student's t.
Trimmed, because what a round does not cancel (a burst of load inside one arm's sample) comes as
rounds far off the rest, and the trimmed mean of a symmetric distribution is its centre.

With threshold T (the slowdown the gate exists to catch) and the interval at level alpha:

    slower        the interval's lower bound is above 1 + T/2
    faster        the interval's upper bound is below 1 / (1 + T/2)
    unchanged     the interval lies inside (1 / (1 + T), 1 + T)
    inconclusive  none of these

`slower` is tested against T/2, not against 0: two identical worker processes differ by a few
percent for reasons no code change made, which enough rounds would call significant. One-sided
tests at level alpha; across k benchmarks Holm's step-down keeps the chance of any false `slower`
in a whole run at alpha. A benchmark may stop early only when it is `settled`: its interval inside
(1 / (1 + T/2), 1 + T/2), or `faster`. The derivations and the measurements behind these choices:
docs/design/gate-statistics.md.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

__all__ = ["TRIM", "Estimate", "estimate", "trimmed_count", "degrees_of_freedom", "trimmed_mean", "t_quantile",
           "verdict", "settled", "Look", "look", "holm_levels", "decide"]

TRIM = 0.2  # the fraction of rounds trimmed from each end of the sorted log ratios (Yuen's usual 20 %)


def _t():
    """Student's t from scipy, imported when first needed: most pytest runs that load the plugin
    judge nothing, and scipy.stats takes about 0.6 s to import."""
    from scipy.stats import t

    return t


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: int) -> float:
    """Student's t quantile, remembered: the sizing asks for the same few hundred (level, df) pairs
    at every look, and scipy's ppf costs about 0.1 ms a call."""
    return float(_t().ppf(q, df))


def trimmed_count(n: int, trim: float = TRIM) -> int:
    """g: the values trimmed from each end of a sample of n (none below 5 values)."""
    return int(trim * n) if n >= 5 else 0


def degrees_of_freedom(n: int, trim: float = TRIM) -> int:
    """Of the trimmed mean of n values: the h = n - 2g values kept, less one."""
    return n - 2 * trimmed_count(n, trim) - 1


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
        t = t_quantile(1 - alpha, self.dof) if self.se > 0 else 0.0
        return math.exp(self.mean_log_ratio - t * self.se), math.exp(self.mean_log_ratio + t * self.se)


def _half(threshold: float) -> float:
    return math.log1p(threshold / 2)


def estimate(baseline: list[float], candidate: list[float], threshold: float, trim: float = TRIM) -> Estimate:
    """The paired estimate from one sample per arm per round (times, seconds). `trim=0`: the rounds'
    plain mean and Student's t (docs/notes/measure compares the two)."""
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
    """(trimmed mean, Yuen's standard error, degrees of freedom) of one sample: g = trimmed_count(n)
    values cut from each end; the error from the winsorised sample (those g set to the nearest kept
    value) as sqrt((n - 1) s_w^2 / (h (h - 1))), h = n - 2g kept, with h - 1 degrees of freedom.
    With g = 0 it is the mean, its standard error and n - 1. (scipy.stats has Yuen's test only for
    two independent samples, `ttest_ind(trim=)`; the rounds here are paired, one log ratio each.)
    `trim` in [0, 0.4): from 0.4 on, 5 values would keep 1 (no error to take)."""
    if not 0 <= trim < 0.4:
        raise ValueError(f"trim must be a fraction in [0, 0.4), got {trim}")
    n = len(values)
    if n == 0:
        return math.nan, math.inf, 0
    g = trimmed_count(n, trim)
    ordered = sorted(values)
    kept = ordered[g:n - g]
    h = len(kept)
    mean = statistics.fmean(kept)
    if n < 2:
        return mean, math.inf, 0
    winsorised = [min(max(v, kept[0]), kept[-1]) for v in ordered]
    se = math.sqrt((n - 1) * statistics.variance(winsorised) / (h * (h - 1)))
    return mean, se, degrees_of_freedom(n, trim)


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


@dataclass(frozen=True)
class Look:
    """What one look at a benchmark's rounds sees at one level (look): all the gate's loop asks of
    them there, so that a look is one call of this module."""
    estimate: Estimate
    level: float
    interval: tuple[float, float]  # estimate.interval(level)
    verdict: str                   # verdict(estimate, threshold, level)
    settled: bool                  # settled(estimate, threshold, level): more rounds cannot make it `slower`


def look(baseline: list[float], candidate: list[float], threshold: float, level: float) -> Look:
    """The paired estimate of these rounds (estimate), its interval, verdict and whether it is
    settled, all at `level`."""
    est = estimate(baseline, candidate, threshold)
    return Look(est, level, est.interval(level), verdict(est, threshold, level), settled(est, threshold, level))


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
