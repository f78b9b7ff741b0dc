"""Test-by-test durations of two sets of pytest logs (made with --durations=0), e.g. paired_suite.sh's.

    python docs/notes/measure/durations_diff.py "/tmp/paired-logs.X/pair*-A.log" "/tmp/paired-logs.X/pair*-B.log"

Each test's time (setup + call + teardown) is its median over the logs of its side. Prints the sums over the
tests both sides ran and over each side's own, and the tests whose medians differ most.
"""

from __future__ import annotations

import glob
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)")


def durations(path: str) -> dict[str, float]:
    times: dict[str, float] = defaultdict(float)
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                times[m.group(3)] += float(m.group(1))
    return times


def medians(pattern: str) -> dict[str, float]:
    runs = [durations(p) for p in sorted(glob.glob(pattern))]
    if not runs:
        raise SystemExit(f"no log matches {pattern}")
    tests = set().union(*runs)
    return {t: statistics.median(r.get(t, 0.0) for r in runs) for t in tests}


def main(a_pattern: str, b_pattern: str, top: int = 25) -> None:
    a, b = medians(a_pattern), medians(b_pattern)
    both = a.keys() & b.keys()
    print(f"tests in both: {len(both)}; A {sum(a[t] for t in both):.1f} s, B {sum(b[t] for t in both):.1f} s")
    print(f"A only: {len(a.keys() - both)} tests, {sum(a[t] for t in a.keys() - both):.1f} s; "
          f"B only: {len(b.keys() - both)} tests, {sum(b[t] for t in b.keys() - both):.1f} s")
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for t in both:
        f = t.split("::")[0]
        by_file[f][0] += a[t]
        by_file[f][1] += b[t]
    print("\nfiles, B - A:")
    for f, (x, y) in sorted(by_file.items(), key=lambda kv: kv[1][0] - kv[1][1])[:top]:
        print(f"  {y - x:+7.2f} s  A {x:7.2f}  B {y:7.2f}  {f}")
    print("\ntests, B - A:")
    for t in sorted(both, key=lambda t: a[t] - b[t])[:top]:
        print(f"  {b[t] - a[t]:+7.2f} s  A {a[t]:6.2f}  B {b[t]:6.2f}  {t}")
    print("\nB only, slowest:")
    for t in sorted(b.keys() - both, key=lambda t: -b[t])[:10]:
        print(f"  {b[t]:6.2f} s  {t}")


if __name__ == "__main__":
    main(*sys.argv[1:3], *(int(x) for x in sys.argv[3:4]))
