"""`mgpu history --since REF`: judge only the steps made after REF. A job on main that runs after
every push passes the commit its last run saw (GitHub's `github.event.before`): a regression it
reported then, and one fixed since, no longer hold every later run at exit 1 or 4.

    earlier_at = since_position(repo, "a1b2c3d", history.line)      # HistoryError: not on the line
    judged, earlier = split_since(history.change_points, history.line, earlier_at)

The rule: a change point whose step lies at or before REF (its after_commit, the first commit with
runs after the step, is REF or older on HEAD's first-parent line) is `earlier`: listed with that
verdict, never confirmed, not counted in the exit code. The others are judged as without --since.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mgpu_perf.history.commits import _git
from mgpu_perf.history.errors import HistoryError

__all__ = ["EARLIER", "since_position", "split_since"]

EARLIER = "earlier"  # the verdict of a change point whose step lies at or before --since


def since_position(repo: Path, ref: str, line: tuple[str, ...]) -> int:
    """REF's place on HEAD's first-parent line (0 the oldest). HistoryError naming --since when git
    does not know it, or it is not on the line (a commit of a merged branch, another branch)."""
    done = _git(repo, ["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
    full = done.stdout.strip()
    if done.returncode != 0 or not full:
        raise HistoryError(f"--since {ref}: no such commit in {repo}")
    if full not in line:
        raise HistoryError(f"--since {ref}: {full[:10]} is not on HEAD's first-parent line (a commit of a merged "
                           "branch, or of another branch): give a commit of the line, such as the merge")
    return line.index(full)


def split_since(points, line: tuple[str, ...], position: int) -> tuple[tuple, tuple]:
    """(the points to judge, the earlier ones with verdict `earlier`), each in the points' order."""
    index = {commit: i for i, commit in enumerate(line)}
    judged = tuple(p for p in points if index[p.after_commit] > position)
    earlier = tuple(replace(p, verdict=EARLIER) for p in points if index[p.after_commit] <= position)
    return judged, earlier
