"""The A/B gate's statistics: a paired ratio from per-round log ratios, its interval, a verdict,
and Holm's correction across the gated benchmarks of one run.

Each round times both arms back to back (A B, then B A, ...), so whatever the machine does during
a round (a VM's host busy for a second, a slow minute) hits both arms of that round alike. The
round's log ratio log(candidate / baseline) cancels it; the rounds' mean log ratio estimates the
slowdown, and Student's t gives its interval (scipy.stats).

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

import math
import statistics
from dataclasses import asdict, dataclass


def _t():
    """Student's t from scipy, imported when first needed: most pytest runs that load the plugin
    judge nothing, and scipy.stats takes about 0.6 s to import."""
    from scipy.stats import t

    return t

__all__ = ["Estimate", "estimate", "verdict", "settled", "holm_levels", "decide", "VERDICTS"]

VERDICTS = ("slower", "faster", "unchanged", "inconclusive")


@dataclass(frozen=True)
class Estimate:
    rounds: int
    mean_log_ratio: float   # mean over rounds of log(candidate / baseline)
    se: float               # its standard error
    p_slower: float         # one-sided p-value of "slower by more than T/2" (H0: ratio <= 1 + T/2)

    @property
    def ratio(self) -> float:
        return math.exp(self.mean_log_ratio)

    def interval(self, alpha: float) -> tuple[float, float]:
        """The ratio's (1 - 2 alpha) interval: each bound a one-sided bound at level alpha."""
        if self.rounds < 2 or not math.isfinite(self.se):
            return 0.0, math.inf
        t = _t().ppf(1 - alpha, self.rounds - 1) if self.se > 0 else 0.0
        return math.exp(self.mean_log_ratio - t * self.se), math.exp(self.mean_log_ratio + t * self.se)

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


def _half(threshold: float) -> float:
    return math.log1p(threshold / 2)


def estimate(baseline: list[float], candidate: list[float], threshold: float) -> Estimate:
    """The paired estimate from one sample per arm per round (times, seconds)."""
    if len(baseline) != len(candidate):
        raise ValueError(f"paired samples need as many baseline as candidate rounds ({len(baseline)} != {len(candidate)})")
    if any(not (t > 0 and math.isfinite(t)) for t in (*baseline, *candidate)):
        raise ValueError("every sample must be a positive, finite time")
    logs = [math.log(c / b) for b, c in zip(baseline, candidate)]
    n = len(logs)
    mean = statistics.fmean(logs) if logs else math.nan
    se = statistics.stdev(logs) / math.sqrt(n) if n >= 2 else math.inf
    if n < 2:
        p = 1.0
    elif se == 0:
        p = 0.0 if mean > _half(threshold) else 1.0
    else:
        p = float(_t().sf((mean - _half(threshold)) / se, n - 1))
    return Estimate(rounds=n, mean_log_ratio=mean, se=se, p_slower=p)


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
