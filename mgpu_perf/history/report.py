"""`mgpu history --json FILE`: every machine's runs and every change point, in one JSON record.

    record = history_json(history, findings)   # findings: after --confirm; else the history's own
"""

from __future__ import annotations

from mgpu_perf.history.verdicts import Findings

__all__ = ["history_json"]


def _key(p) -> tuple:
    return p.machine, p.benchmark, p.before_commit, p.after_commit


def history_json(history, findings: Findings | None = None) -> dict:
    """The record: storage, HEAD, per machine its benchmarks' runs and change points, the runs not
    placed, the unreadable files, every change point (to_json), what confirming said (--confirm) and
    the exit code with its summary."""
    findings = findings or Findings(history.change_points)
    points = findings.points
    current = {_key(p): p for p in points}
    machines = []
    for m in history.machines:
        benchmarks = [{"benchmark": b.benchmark, "unusable_runs": b.unusable,
                       "runs": [{"commit": t.commit, "position": t.position, "file": t.file, "seconds": t.seconds}
                                for t in b.timed],
                       "change_points": [current.get(_key(p), p).to_json() for p in b.change_points]
                       + [p.to_json() for p in findings.found_by_gate(m.machine.label, b.benchmark)]}
                      for b in m.benchmarks]
        machines.append({"machine": m.machine.to_json(), "runs": m.runs, "benchmarks": benchmarks})
    return {"storage": history.storage, "repo": history.repo, "head": history.head, "first_parent_commits": len(history.line),
            "machines": machines, "change_points": [p.to_json() for p in points],
            "not_placed": [{"file": a.run.file, "commit": a.run.commit, "why": a.why, "kind": a.kind,
                            "machine": a.run.machine.label}
                           for a in history.apart],
            "unreadable": list(history.unreadable), "notes": list(history.notes), "confirm_notes": list(findings.notes),
            "unchecked": [p.to_json() for p in findings.unchecked], "exit_code": findings.exit_code,
            "summary": findings.summary}
