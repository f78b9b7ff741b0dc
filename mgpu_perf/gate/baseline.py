"""The gate's two trees: the candidate (the repository the run starts in, as its working tree holds
it) and the baseline (`--ab-baseline REF`: a git revision of that repository, checked out into a
temporary worktree when the first gated benchmark runs, or another checkout given as a folder).

    root = repository_root(Path.cwd())
    baseline = check_baseline("origin/main", root)     # bad input: ValueError naming it; nothing created
    tree = baseline.checkout()                          # the worktree (removed by baseline.remove())
    trees = read_trees(root, "origin/main")             # both trees as a gate run needs them (GateError)

Everything here is cheap (a few `git` calls) and runs when the options are read, so bad input fails
before anything is timed; the worktree itself waits for the first gated benchmark.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mgpu_perf.errors import GateError

__all__ = ["Baseline", "Trees", "repository_root", "is_mgpu_checkout", "check_baseline", "uncommitted_changes",
           "describe_candidate", "head_commit", "read_trees"]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def repository_root(start: Path) -> Path:
    """The top of the git repository holding `start`, else `start` itself."""
    try:
        out = _git(start, "rev-parse", "--show-toplevel")
    except OSError:  # no git at all
        return Path(start).resolve()
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 else Path(start).resolve()


def is_mgpu_checkout(path: Path) -> bool:
    """A checkout of mgpu itself: its workers must import `mgpu` from their own tree."""
    pyproject = Path(path) / "pyproject.toml"
    return (Path(path) / "mgpu" / "__init__.py").is_file() and pyproject.is_file() and \
        'name = "mgpu"' in pyproject.read_text(errors="replace")


@dataclass
class Baseline:
    ref: str                    # as the user gave it
    root: Path                  # the repository it is a revision of (the candidate's)
    sha: str | None = None      # a revision: its commit; a folder: None
    folder: Path | None = None  # a folder: the other checkout
    worktree: Path | None = None

    def describe(self) -> str:
        return f"{self.ref} ({self.sha[:12]})" if self.sha else f"{self.ref} (folder)"

    def checkout(self) -> Path:
        """The baseline's tree: the folder, or a new detached worktree at the revision."""
        if self.folder is not None:
            return self.folder
        if self.worktree is None:
            worktree = Path(tempfile.mkdtemp(prefix="mgpu-ab-baseline-"))
            out = _git(self.root, "worktree", "add", "--detach", "--force", str(worktree), self.sha)
            if out.returncode != 0:
                shutil.rmtree(worktree, ignore_errors=True)
                raise ValueError(f"--ab-baseline {self.ref}: git worktree add failed: "
                                 f"{(out.stderr.strip().splitlines() or ['no message'])[-1]}")
            self.worktree = worktree
        return self.worktree

    def remove(self) -> None:
        if self.worktree is not None:
            _git(self.root, "worktree", "remove", "--force", str(self.worktree))
            shutil.rmtree(self.worktree, ignore_errors=True)
            _git(self.root, "worktree", "prune")
            self.worktree = None


def check_baseline(ref: str, root: Path) -> Baseline:
    """`ref` as a baseline of the repository at `root`: a folder, or a revision of that repository.
    ValueError with the reason if it is neither (or, in a checkout of mgpu, holds no mgpu)."""
    mgpu_itself = is_mgpu_checkout(root)
    path = Path(ref).expanduser()
    if path.is_dir():
        if mgpu_itself and not is_mgpu_checkout(path):
            raise ValueError(f"--ab-baseline {ref}: the folder is not a checkout of mgpu (no mgpu/ and pyproject.toml "
                             "naming mgpu)")
        if path.resolve() == Path(root).resolve():
            raise ValueError(f"--ab-baseline {ref}: that folder is the candidate itself; give a revision (such as "
                             "HEAD) or another checkout")
        return Baseline(ref, Path(root), folder=path.resolve())
    try:
        inside = _git(root, "rev-parse", "--is-inside-work-tree")
    except OSError:
        raise ValueError(f"--ab-baseline {ref}: no such folder, and git is not installed to read it as a revision") \
            from None
    if inside.returncode != 0:
        raise ValueError(f"--ab-baseline {ref}: no such folder, and {root} is not a git repository to take it as a "
                         "revision of")
    out = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if out.returncode != 0:
        raise ValueError(f"--ab-baseline {ref}: not a revision of the repository at {root} (nor a folder)")
    sha = out.stdout.strip()
    if mgpu_itself and _git(root, "cat-file", "-e", f"{sha}:mgpu/__init__.py").returncode != 0:
        raise ValueError(f"--ab-baseline {ref}: revision {sha[:12]} holds no mgpu package")
    return Baseline(ref, Path(root), sha=sha)


def uncommitted_changes(root: Path) -> list[str]:
    """Tracked files of the repository at `root` that differ from HEAD (staged or not); [] outside git."""
    try:
        out = _git(root, "status", "--porcelain", "--untracked-files=no")
    except OSError:
        return []
    return [line[3:].split(" -> ")[-1] for line in out.stdout.splitlines() if len(line) > 3] \
        if out.returncode == 0 else []


def head_commit(root: Path) -> str | None:
    """The full hash of the commit checked out at `root` (the candidate's commit; its working tree may
    differ: uncommitted_changes); None outside git."""
    try:
        out = _git(root, "rev-parse", "--verify", "--quiet", "HEAD")
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def describe_candidate(root: Path, changes: list[str]) -> str:
    """What the candidate arm times: the working tree, saying so when it is not a commit."""
    if not changes:
        return f"the working tree of {root} (no uncommitted changes)"
    listed = ", ".join(changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
    return f"the working tree of {root}, WITH uncommitted changes to {listed}"


@dataclass(frozen=True)
class Trees:
    """What a gate run times, read once as it is made: the candidate (the working tree at `root`) and
    the baseline (a revision or a folder: `baseline`; None: this tree under `baseline_python`)."""
    root: Path
    baseline: Baseline | None
    baseline_python: str        # the baseline arm's Python: sys.executable unless --ab-baseline-python
    require_mgpu: bool          # a checkout of mgpu: each arm's workers import their own tree's mgpu
    baseline_desc: str          # "origin/main (0123456789ab)", in the reports
    candidate_desc: str         # the working tree, naming uncommitted changes
    candidate_commit: str | None  # in ab.json and the Markdown summary


def read_trees(root: Path, baseline_ref: str | None = None, baseline_python: str | None = None) -> Trees:
    """Both trees of a gate run started in the repository at `root`; GateError (one line) for a
    baseline that is none (no REF and no Python, a REF that is neither a revision nor a folder of
    it, a Python that is not an executable file). Nothing is checked out yet (Baseline.checkout)."""
    if not baseline_ref and not baseline_python:
        raise GateError("the gate needs a baseline: --ab-baseline REF (a revision or another checkout) or "
                        "--ab-baseline-python PATH")
    if baseline_python and not (os.path.isfile(baseline_python) and os.access(baseline_python, os.X_OK)):
        raise GateError(f"--ab-baseline-python {baseline_python}: not an executable file")
    root = Path(root).resolve()
    try:
        baseline = check_baseline(baseline_ref, root) if baseline_ref else None
    except ValueError as e:
        raise GateError(str(e)) from None
    changes = uncommitted_changes(root)
    return Trees(root, baseline, baseline_python or sys.executable, is_mgpu_checkout(root),
                 baseline_desc=(baseline.describe() if baseline else "this tree") +
                 (f" with {baseline_python}" if baseline_python else ""),
                 candidate_desc=describe_candidate(root, changes), candidate_commit=head_commit(root))
