"""Change points of one benchmark's runs over the commits, found by a library made for it (ruptures'
PELT, docs/guide/history.md says why this one) and each tested on the runs either side.

    points = find_change_points(series, line, "test_step[single]", machine.label, settings)

The rule:
1. One value a commit: the median of its runs' log medians (a step is a ratio, so logs make it
   additive and the same size at any speed). Breakpoints can only fall between commits: a change
   between two runs of one commit is the machine's, no commit's.
2. PELT with the l2 cost and the penalty 2 sigma^2 ln n (a BIC-like cost of one more segment), sigma the
   commit-to-commit noise estimated robustly (the median absolute difference of neighbours, which a
   few steps do not move); segments of at least 2 commits.
3. Each breakpoint is tested on the runs of the segments either side: Student's t-test on their
   log medians (two-sided, pooled variance: one machine's noise on both sides; scipy.stats) and the
   ratio of their medians. Welch's test, with its degrees of freedom near 1 when a side has 2 runs,
   misses a 20 % step that a creep's breakpoint follows closely; Mann-Whitney's U cannot reach
   p < 0.01 with fewer than 5 runs a side. A breakpoint is kept when p < alpha and the ratio differs
   from 1 by at least min_change; of those that fail, the smallest step is dropped (its segments
   merge, so a real step's short neighbour grows) and the rest are tested again.
   A breakpoint is also dropped when fewer than MIN_SEGMENT commits of a side measure nearer that
   side's level than the other's: with one commit of a 2-commit segment an outlier (one run under
   load), the segment's median is half that outlier, and the point would blame a commit whose own
   runs measured the old level.
   The p-value is optimistic (the breakpoint was chosen where the runs differ most): it ranks
   suspicions, and the A/B gate (--confirm) decides.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

__all__ = ["ChangePoint", "find_change_points", "MIN_SEGMENT"]

MIN_SEGMENT = 2  # commits a segment must span at least: one commit alone is one noisy moment


@dataclass(frozen=True)
class ChangePoint:
    """A step in one benchmark's runs on one machine. before_commit: the last commit with runs before
    the step; after_commit: the first with runs after it; commits_between: the first-parent commits in
    before_commit..after_commit (git's range: after before_commit, up to and including after_commit),
    oldest first: one of them made the step. verdict: `suspected` until confirmed (`slower`, `faster`,
    `unconfirmed`, `creep`, set by history/confirm.py), which also names `commit`, the full hash of the
    first commit after the step, when the gate finds it. from_commit..to_commit: the span whose runs
    the ratio compares (the first commit of the segment before, the last of the segment after), and
    span_between its first-parent commits after from_commit, oldest first: where a creep lies that
    the commits of before..after alone do not show (history/confirm.py gates it). found_by: `runs` for
    the detector's points; `gate` for a change --confirm found after the commit it named, within a
    point's range (its medians and p-value the gate's rounds', no runs either side)."""
    benchmark: str
    machine: str
    before_commit: str
    after_commit: str
    commits_between: tuple
    median_before: float      # seconds: the median of the runs in the segment before
    median_after: float
    ratio: float              # median_after / median_before: > 1 slower
    p_value: float            # Student's t-test, two-sided, on the log medians of the runs before and after
    verdict: str = "suspected"
    commit: str | None = None
    runs_before: int = 0
    runs_after: int = 0
    from_commit: str | None = None
    to_commit: str | None = None
    span_between: tuple = ()
    found_by: str = "runs"   # "gate": found by --confirm after the commit it named, within a point's range

    @property
    def slower(self) -> bool:
        return self.ratio > 1

    def to_json(self) -> dict:
        record = asdict(self)
        record["commits_between"] = list(self.commits_between)
        record["span_between"] = list(self.span_between)
        record["direction"] = "slower" if self.slower else "faster"
        if not math.isfinite(self.p_value):  # JSON has no NaN: a change the gate found faster has no p of its own
            record["p_value"] = None
        return record


def _noise(levels: list[float]) -> float:
    """sigma of one commit's level, from the median absolute difference of neighbours (a step or two
    among them moves it little), floored so that identical values give no breakpoint."""
    diffs = sorted(abs(b - a) for a, b in zip(levels, levels[1:]))
    mad = diffs[len(diffs) // 2] if diffs else 0.0
    return max(mad / (0.6745 * math.sqrt(2)), 1e-4)


def _breakpoints(levels: list[float]) -> list[int]:
    """PELT's breakpoints: indices b such that a segment starts at levels[b] (0 and len excluded)."""
    import numpy as np

    try:
        import ruptures
    except ImportError:
        from mgpu_perf.history.errors import HistoryError

        raise HistoryError("mgpu history finds change points with ruptures, which this Python lacks: "
                           "pip install 'mgpu[history]'") from None

    n = len(levels)
    if n < 2 * MIN_SEGMENT:
        return []
    sigma = _noise(levels)
    algo = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(np.asarray(levels).reshape(-1, 1))
    return [b for b in algo.predict(pen=2 * sigma ** 2 * math.log(n)) if 0 < b < n]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _supported(before: list[float], after: list[float], low: float, high: float) -> bool:
    """Whether MIN_SEGMENT commits of each side (their levels: log medians) measure nearer that side's
    level (low before, high after) than the other side's: the step rests on more than one commit."""
    nearer_before = sum(abs(level - low) < abs(level - high) for level in before)
    nearer_after = sum(abs(level - high) < abs(level - low) for level in after)
    return nearer_before >= MIN_SEGMENT and nearer_after >= MIN_SEGMENT


def _test(groups: list[list[float]], cuts: list[int], settings) -> list[tuple[int, float, float, bool]]:
    """(cut, ratio, p, supported) of each cut, the runs of the segments either side compared, and
    whether MIN_SEGMENT commits of each side show its level (_supported)."""
    from scipy.stats import ttest_ind

    bounds = [0, *cuts, len(groups)]
    levels = [_median([math.log(v) for v in g]) for g in groups]
    out = []
    for k, cut in enumerate(cuts):
        before = [v for g in groups[bounds[k]:cut] for v in g]
        after = [v for g in groups[cut:bounds[k + 2]] for v in g]
        ratio = _median(after) / _median(before)
        supported = _supported(levels[bounds[k]:cut], levels[cut:bounds[k + 2]], math.log(_median(before)),
                               math.log(_median(after)))
        with warnings.catch_warnings():  # identical runs (a synthetic history): scipy's precision warning
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(ttest_ind([math.log(v) for v in before], [math.log(v) for v in after], equal_var=True).pvalue)
        p = 1.0 if math.isnan(p) else p  # both sides constant: nothing to test
        out.append((cut, ratio, p, supported))
    return out


def _kept(tested, settings) -> list[tuple[int, float, float, bool]]:
    return [(cut, ratio, p, supported) for cut, ratio, p, supported in tested
            if p < settings.alpha and abs(math.log(ratio)) >= math.log1p(settings.min_change) and supported]


def find_change_points(series, line: tuple[str, ...], benchmark: str, machine: str, settings) -> tuple[ChangePoint, ...]:
    """The change points of one benchmark on one machine. `series`: (position on `line`, seconds)
    per run, ordered by position; `settings`: alpha and min_change (HistorySettings)."""
    positions, groups = [], []
    for position, seconds in series:
        if not positions or positions[-1] != position:
            positions.append(position)
            groups.append([])
        groups[-1].append(seconds)
    levels = [_median([math.log(v) for v in g]) for g in groups]
    cuts = _breakpoints(levels)
    while True:
        tested = _test(groups, cuts, settings)
        kept = _kept(tested, settings)
        if len(kept) == len(tested):
            break
        smallest = min((item for item in tested if item not in kept), key=lambda item: abs(math.log(item[1])))
        cuts = [cut for cut in cuts if cut != smallest[0]]
    bounds = [0, *cuts, len(groups)]
    points = []
    for k, (cut, ratio, p, _) in enumerate(tested):
        before = [v for g in groups[bounds[k]:cut] for v in g]
        after = [v for g in groups[cut:bounds[k + 2]] for v in g]
        first, last = positions[cut - 1], positions[cut]
        start, end = positions[bounds[k]], positions[bounds[k + 2] - 1]
        points.append(ChangePoint(benchmark, machine, line[first], line[last], tuple(line[first + 1:last + 1]),
                                  _median(before), _median(after), ratio, p, runs_before=len(before),
                                  runs_after=len(after), from_commit=line[start], to_commit=line[end],
                                  span_between=tuple(line[start + 1:end + 1])))
    return tuple(points)
