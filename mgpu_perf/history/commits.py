"""The order of the runs: the current branch's first-parent line (`git rev-list --first-parent HEAD`),
oldest first. A merge into the branch is one step on that line, so each step is a commit the branch
really was at; a run of a commit off the line (a pull request's branch, a rebased-away commit) has no
place on it and is listed apart, never guessed into one, with why (lineage_of asks git which of
these it is: a merged branch's commit, another branch's, or a commit the repository lacks).

    line = first_parent_line(Path("."))        # ("a1b2...", ..., HEAD's hash), oldest first
    placed, apart = place_runs(runs, line, lineage_of(Path("."), [run.commit for run in runs]))
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from mgpu_perf.history.errors import HistoryError
from mgpu_perf.history.runs import Run

__all__ = ["first_parent_line", "place_runs", "Apart", "Lineage", "lineage_of", "repository_root", "OFF_LINE",
           "MERGED", "MISSING", "COPY", "KINDS", "kinds_text"]

OFF_LINE = "not on the first-parent line of HEAD"
MERGED = OFF_LINE + ": a commit of a branch merged into it (its merge is the step on the line)"
MISSING = "not in this repository (a rebased-away or force-pushed commit, or another repository's run)"
COPY = "the same run as {file} (saved twice: counted once)"
KINDS = {OFF_LINE: "off line", MERGED: "of a merged branch", MISSING: "not in the repository"}


@dataclass(frozen=True)
class Apart:
    run: Run
    why: str   # "not on the first-parent line of HEAD", "uncommitted changes", "no commit recorded"
    kind: str = "off line"  # one of KINDS: what the why says, for counting


@dataclass(frozen=True)
class Lineage:
    """What the repository knows of the commits the runs name: HEAD's ancestors (every commit it
    holds, merged branches' included), which named commits it holds at all, and whether it is a
    shallow clone (its history cut: an older commit is missing from it, not from the project)."""
    ancestors: frozenset = frozenset()
    present: frozenset = frozenset()
    shallow: bool = False


def _git(repo: Path, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=repo, input=stdin, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HistoryError(f"{repo}: cannot run git {args[0]} ({e})") from None


def repository_root(repo: Path) -> str:
    """The top folder of the git repository `repo` lies in (a folder inside another repository is
    read as that repository: the header names it, so that is never a surprise)."""
    done = _git(repo, ["rev-parse", "--show-toplevel"])
    return done.stdout.strip() if done.returncode == 0 else str(repo)


def lineage_of(repo: Path, commits) -> Lineage:
    """The Lineage of `commits` (recorded ids, full or abbreviated) in `repo`: `git rev-list HEAD`,
    `git cat-file --batch-check` for the named ones that are not HEAD's ancestors, and
    `git rev-parse --is-shallow-repository`."""
    ancestors = frozenset(_git(repo, ["rev-list", "HEAD"]).stdout.split())
    named = sorted({c for c in commits if c and c not in ancestors and c not in ("unknown", "unversioned")})
    present = set()
    if named:
        answers = _git(repo, ["cat-file", "--batch-check"], "".join(f"{c}^{{commit}}\n" for c in named)).stdout
        present = {c for c, answer in zip(named, answers.splitlines()) if not answer.endswith("missing")}
    shallow = _git(repo, ["rev-parse", "--is-shallow-repository"]).stdout.strip() == "true"
    return Lineage(ancestors, frozenset(present), shallow)


def _off_line(run: Run, lineage: Lineage | None) -> str:
    """Why a run's commit has no place on the line: a merged branch's, another branch's, or none the
    repository holds (with the project the run names, pytest-benchmark's guess from the remote)."""
    commit = run.commit
    if lineage is None:
        return OFF_LINE
    if commit in lineage.ancestors or (len(commit) >= 7 and any(a.startswith(commit) for a in lineage.ancestors)):
        return MERGED
    if commit in lineage.present:
        return OFF_LINE
    return MISSING + (f"; it names project {run.project!r}" if run.project else "")


def kinds_text(apart) -> str:
    """How many runs apart of each kind, in the order first met: '6 of a merged branch, 1 uncommitted'."""
    counts: dict[str, int] = {}
    for a in apart:
        counts[a.kind] = counts.get(a.kind, 0) + 1
    return ", ".join(f"{count} {kind}" for kind, count in counts.items())


def first_parent_line(repo: Path) -> tuple[str, ...]:
    """HEAD's first-parent commits, full hashes, oldest first. HistoryError when `repo` is no git
    repository or has no commit."""
    if not Path(repo).is_dir():
        raise HistoryError(f"--repo {repo}: no such folder (the git repository whose branch orders the runs)")
    done = _git(repo, ["rev-list", "--first-parent", "--reverse", "HEAD"])
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


def _identity(run: Run) -> tuple:
    """What makes two files one run: its commit, its own time, its machine and its medians (a run
    copied into a second folder of the storage is still one run of evidence)."""
    return run.commit, run.saved, run.machine, run.medians


def place_runs(runs, line: tuple[str, ...], lineage: Lineage | None = None
               ) -> tuple[tuple[tuple[int, Run], ...], tuple[Apart, ...]]:
    """((position on the line, run), ...) ordered by position then the run's own time, and the runs
    that have no place, each with why (`lineage`, lineage_of's: which kind of commit off the line)."""
    index = {commit: i for i, commit in enumerate(line)}
    placed, apart, seen = [], [], {}
    for run in runs:
        if run.saved and (first := seen.setdefault(_identity(run), run)) is not run:
            apart.append(Apart(run, COPY.format(file=first.file), "copy"))
        elif run.commit in ("unknown", "unversioned", ""):
            apart.append(Apart(run, "no commit recorded", "no commit"))
        elif run.dirty:
            apart.append(Apart(run, "uncommitted changes: it timed no commit", "uncommitted"))
        elif (position := _position(run.commit, index, line)) is None:
            why = _off_line(run, lineage)
            apart.append(Apart(run, why, KINDS[why.split(";")[0]]))
        else:
            placed.append((position, run))
    placed.sort(key=lambda item: (item[0], item[1].saved, item[1].file))
    return tuple(placed), tuple(apart)
