"""The order of the runs: the current branch's first-parent line (`git rev-list --first-parent HEAD`),
oldest first. A merge into the branch is one step on that line, so each step is a commit the branch
really was at; a run of a commit off the line (a pull request's branch, a rebased-away commit) has no
place on it and is listed apart, never guessed into one.

    line = first_parent_line(Path("."))        # ("a1b2...", ..., HEAD's hash), oldest first
    placed, apart = place_runs(runs, line)
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from mgpu_perf.history.errors import HistoryError
from mgpu_perf.history.runs import Run

__all__ = ["first_parent_line", "place_runs", "Apart"]


@dataclass(frozen=True)
class Apart:
    run: Run
    why: str   # "not on the first-parent line of HEAD", "uncommitted changes", "no commit recorded"


def first_parent_line(repo: Path) -> tuple[str, ...]:
    """HEAD's first-parent commits, full hashes, oldest first. HistoryError when `repo` is no git
    repository or has no commit."""
    try:
        done = subprocess.run(["git", "rev-list", "--first-parent", "--reverse", "HEAD"], cwd=repo,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HistoryError(f"{repo}: cannot run git rev-list ({e})") from None
    if done.returncode != 0:
        raise HistoryError(f"{repo}: not a git repository with a commit (git rev-list --first-parent HEAD: "
                           f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode})")
    return tuple(done.stdout.split())


def _position(commit: str, index: dict[str, int], line: tuple[str, ...]) -> int | None:
    """Where a recorded commit id sits on the line: its full hash, or an abbreviation of one."""
    if commit in index:
        return index[commit]
    if len(commit) >= 7:
        found = [i for i, full in enumerate(line) if full.startswith(commit)]
        if len(found) == 1:
            return found[0]
    return None


def place_runs(runs, line: tuple[str, ...]) -> tuple[tuple[tuple[int, Run], ...], tuple[Apart, ...]]:
    """((position on the line, run), ...) ordered by position then the run's own time, and the runs
    that have no place, each with why."""
    index = {commit: i for i, commit in enumerate(line)}
    placed, apart = [], []
    for run in runs:
        if run.commit in ("unknown", "unversioned", ""):
            apart.append(Apart(run, "no commit recorded"))
        elif run.dirty:
            apart.append(Apart(run, "uncommitted changes: it timed no commit"))
        elif (position := _position(run.commit, index, line)) is None:
            apart.append(Apart(run, "not on the first-parent line of HEAD"))
        else:
            placed.append((position, run))
    placed.sort(key=lambda item: (item[0], item[1].saved, item[1].file))
    return tuple(placed), tuple(apart)
