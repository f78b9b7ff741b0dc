"""Every run pytest-benchmark saved (`--benchmark-autosave`, `--benchmark-save NAME`): its commit, its
machine and each benchmark's median, read with pytest-benchmark's own storage reader
(pytest_benchmark.storage.file.FileStorage), so the file layout is its, not ours.

    runs, unreadable = read_runs(Path(".benchmarks"))

A run's unit of evidence is its median per benchmark: the samples inside one run share one moment
of the machine, so they are not independent of each other; runs are.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from mgpu_perf.history.errors import HistoryError
from mgpu_perf.history.machines import Machine, machine_of

__all__ = ["Run", "read_runs"]


@dataclass(frozen=True)
class Run:
    file: str                 # relative to the storage folder: Linux-CPython-3.11-64bit/0007_<commit>_<date>.json
    commit: str               # commit_info's id: the full hash, or "unversioned" / "unknown"
    dirty: bool               # saved with uncommitted changes: it timed no commit
    saved: str                # the run's own datetime (ISO), to order runs of one commit
    machine: Machine
    medians: tuple[tuple[str, float], ...]  # (benchmark's fullname, median seconds)
    unusable: tuple[str, ...] = ()          # benchmarks it holds with no median to compare (0 s, none)
    project: str = ""                       # commit_info's project: pytest-benchmark's name for the repository


class _Warnings:
    """The logger FileStorage wants: its warnings (a file it could not read) are kept to be reported."""

    def __init__(self):
        self.lines: list[str] = []

    def warning(self, text: str) -> None:
        self.lines.append(str(text))

    def info(self, text: str) -> None:
        pass


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _medians(data: dict, statistic: str = "median") -> tuple[tuple[tuple[str, float], ...], tuple[str, ...]]:
    """(name, value) of each benchmark whose `statistic` (its median unless --statistic says) is above
    0 s, and the names of those without one (0: the timer's resolution above the benchmark's time;
    no ratio can be taken of it)."""
    out, unusable = [], []
    for bench in data.get("benchmarks") or []:
        bench = _dict(bench)
        median = _dict(bench.get("stats")).get(statistic)
        name = bench.get("fullname") or bench.get("name")
        if not name:
            continue
        if isinstance(median, (int, float)) and math.isfinite(median) and median > 0:
            out.append((str(name), float(median)))
        else:
            unusable.append(str(name))
    return tuple(out), tuple(unusable)


def run_of(file: str, data: dict, statistic: str = "median") -> Run:
    """One saved run as a Run (HistoryError when it is no pytest-benchmark run)."""
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise HistoryError(f"{file}: not a pytest-benchmark run (no 'benchmarks')")
    commit = _dict(data.get("commit_info"))
    medians, unusable = _medians(data, statistic)
    return Run(file=file, commit=str(commit.get("id") or "unknown"), dirty=bool(commit.get("dirty")),
               saved=str(data.get("datetime") or ""), machine=machine_of(data.get("machine_info")),
               medians=medians, unusable=unusable, project=str(commit.get("project") or ""))


def read_runs(storage: Path, statistic: str = "median") -> tuple[tuple[Run, ...], tuple[str, ...]]:
    """Every run in a file storage folder, and a line per file that could not be read. HistoryError
    when the folder is missing or holds no run at all."""
    from pytest_benchmark.storage.file import FileStorage

    storage = Path(storage)
    if storage.is_file():
        raise HistoryError(f"{storage}: a file, not a folder: STORAGE is the folder pytest-benchmark saves runs in "
                           f"(--benchmark-storage, .benchmarks by default), which holds <machine>/NNNN_*.json")
    if not storage.is_dir():  # FileStorage would create it: a typo must not read as an empty history
        raise HistoryError(f"{storage}: no such folder (pytest-benchmark's storage, .benchmarks by default)")
    warnings = _Warnings()
    reader = FileStorage(storage, logger=warnings)
    runs = [run_of(Path(path).as_posix(), data, statistic) for path, data in reader.load()]
    if not runs:
        raise HistoryError(f"{storage}: holds no saved run (NNNN_*.json, as `pytest --benchmark-autosave` writes)"
                           + (f"; unreadable: {'; '.join(warnings.lines)}" if warnings.lines else "")
                           + _deeper(storage))
    return tuple(runs), tuple(warnings.lines)


def _deeper(storage: Path) -> str:
    """Where saved runs lie further down, as a hint: the reader looks in STORAGE and its folders only
    (STORAGE/<machine>/NNNN_*.json), so a parent of the storage reads as empty."""
    for file in itertools.islice(storage.rglob("[0-9][0-9][0-9][0-9]_*.json"), 1000):
        if len(file.relative_to(storage).parts) > 2:
            return f"; saved runs lie deeper: try {file.parent.parent}"
    return ""
