"""`mgpu history`'s table on stdout: per machine, per benchmark, its runs and change points.

    print("\n".join(history_lines(history)))
"""

from __future__ import annotations

import math

from mgpu_perf.history.changes import MIN_SEGMENT
from mgpu_perf.history.commits import kinds_text
from mgpu_perf.history.verdicts import Findings

__all__ = ["history_lines", "seconds_text", "point_line"]


def seconds_text(seconds: float) -> str:
    """A duration at a readable scale: 41.2 ms, 812 us, 1.23 s."""
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def point_line(p) -> str:
    """One change point: verdict, direction and ratio, the commit range, the medians, p."""
    count = len(p.commits_between)
    where = f"{p.before_commit[:10]}..{p.after_commit[:10]} ({count} commit{'s' if count != 1 else ''})"
    named = f", made by {p.commit[:10]}" if p.commit else ""
    p_text = f"p={p.p_value:.2g}" if math.isfinite(p.p_value) else "p -"
    source = "(the gate's rounds, after the commit it named)" if p.found_by == "gate" else \
        f"({p.runs_before} runs | {p.runs_after} runs)"
    return (f"{p.verdict:<11} {'slower' if p.ratio > 1 else 'faster'} {p.ratio:.3f}x  {where}{named}  "
            f"{seconds_text(p.median_before)} -> {seconds_text(p.median_after)}  {p_text}  {source}")


def _key(p) -> tuple:
    return p.machine, p.benchmark, p.before_commit, p.after_commit


def _machine_lines(m, current: dict, findings: Findings) -> list[str]:
    lines = [f"machine {m.machine.label}: {m.runs} run(s)"]
    for b in m.benchmarks:
        head = f"  {b.benchmark}: {len(b.timed)} run(s) over {b.commits} commit(s)"
        if b.timed:
            head += f", latest {seconds_text(b.timed[-1].seconds)}"
        if b.unusable:
            head += f" ({b.unusable} more with a median of 0 s or none, left out)"
        short = b.commits < 2 * MIN_SEGMENT
        lines.append(head + ("" if b.change_points else f": too few commits for a change point ({2 * MIN_SEGMENT} "
                                                       "needed)" if short else ": no change point"))
        lines += [f"    {point_line(current.get(_key(p), p))}" for p in b.change_points]
        lines += [f"    {point_line(p)}" for p in findings.found_by_gate(m.machine.label, b.benchmark)]
    return lines


def history_lines(history, findings: Findings | None = None) -> list[str]:
    """The whole table; `findings`: after confirming (default: the history's own change points)."""
    findings = findings or Findings(history.change_points)
    lines = [f"mgpu history: {sum(m.runs for m in history.machines) + len(history.apart)} run(s) in "
             f"{history.storage}, on HEAD {history.head[:10]}'s first-parent line"
             + (f" in {history.repo}" if history.repo else "") + f" ({len(history.line)} commits)"]
    if len(history.machines) > 1:
        lines.append(f"{len(history.machines)} machines: a history each, their runs never compared with each other")
    lines += list(history.notes)
    current = {_key(p): p for p in findings.points}  # a confirmed verdict replaces its suspicion
    for m in history.machines:
        lines += _machine_lines(m, current, findings)
    if history.apart:
        lines.append(f"not placed ({len(history.apart)} run(s) with no place on HEAD's first-parent line, not analysed: "
                     f"{kinds_text(history.apart)}):")
        lines += [f"  {a.run.file}: commit {a.run.commit[:10]}, {a.why} ({a.run.machine.label})" for a in history.apart]
    for text in history.unreadable:
        lines.append(f"unreadable: {text}")
    lines += [f"confirm: {note}" for note in findings.notes]
    lines.append(findings.summary)
    return lines
