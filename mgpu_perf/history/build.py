"""The history: every saved run read, placed on the branch's first-parent line, split by machine,
and each benchmark's change points found.

    history = build_history(settings)     # History: .machines (one per machine), .apart, .unreadable
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpu_perf.history.changes import MIN_SEGMENT, ChangePoint, find_change_points
from mgpu_perf.history.commits import (KINDS, MISSING, Apart, Lineage, first_parent_line, kinds_text, lineage_of,
                                       place_runs, repository_root)
from mgpu_perf.history.errors import HistoryError
from mgpu_perf.history.machines import Machine, host_only_note
from mgpu_perf.history.runs import read_runs

__all__ = ["BenchmarkHistory", "MachineHistory", "History", "build_history"]


@dataclass(frozen=True)
class Timed:
    commit: str      # full hash, on the first-parent line
    position: int    # its place on that line, 0 the oldest
    file: str        # the run's file in the storage
    seconds: float   # the benchmark's median in that run


@dataclass(frozen=True)
class BenchmarkHistory:
    benchmark: str
    timed: tuple[Timed, ...]           # ordered by position
    change_points: tuple[ChangePoint, ...]
    unusable: int = 0                  # placed runs that hold it with no median above 0 s: left out

    @property
    def commits(self) -> int:
        return len({t.commit for t in self.timed})


@dataclass(frozen=True)
class MachineHistory:
    machine: Machine
    runs: int
    benchmarks: tuple[BenchmarkHistory, ...]

    @property
    def change_points(self) -> tuple[ChangePoint, ...]:
        return tuple(p for b in self.benchmarks for p in b.change_points)


@dataclass(frozen=True)
class History:
    storage: str
    head: str                          # HEAD's full hash: the line's newest commit
    line: tuple[str, ...]              # HEAD's first-parent line, oldest first
    machines: tuple[MachineHistory, ...]
    apart: tuple[Apart, ...]           # runs with no place on the line, never in a machine's history
    unreadable: tuple[str, ...]        # files pytest-benchmark's reader could not load
    repo: str = ""                     # the git repository's top folder whose HEAD orders the runs
    notes: tuple[str, ...] = ()        # what the reader should know about the machines (host_only_note)

    @property
    def change_points(self) -> tuple[ChangePoint, ...]:
        return tuple(p for m in self.machines for p in m.change_points)


def _benchmark(name: str, placed, line, machine: Machine, settings) -> BenchmarkHistory:
    timed = tuple(Timed(line[position], position, run.file, seconds)
                  for position, run in placed for bench, seconds in run.medians if bench == name)
    points = find_change_points([(t.position, t.seconds) for t in timed], line, name, machine.label, settings)
    return BenchmarkHistory(name, timed, points, sum(name in run.unusable for _, run in placed))


def _machine(machine: Machine, placed, line, settings) -> MachineHistory:
    names = sorted({bench for _, run in placed for bench in (*dict(run.medians), *run.unusable)})
    return MachineHistory(machine, len(placed), tuple(_benchmark(n, placed, line, machine, settings) for n in names))


def build_history(settings) -> History:
    """The history of settings.storage ordered by settings.repo's HEAD (HistorySettings).
    HistoryError when either cannot be read."""
    runs, unreadable = read_runs(settings.storage, settings.statistic)
    line = first_parent_line(settings.repo)
    root = repository_root(settings.repo)
    lineage = lineage_of(settings.repo, [run.commit for run in runs])
    placed, apart = place_runs(runs, line, lineage)
    _check_placed(f"{len(runs)} run(s) in {settings.storage}", root, placed, apart, lineage)
    machines = list(dict.fromkeys(run.machine for _, run in placed))
    histories = tuple(_machine(m, [(pos, run) for pos, run in placed if run.machine == m], line, settings)
                      for m in machines)
    short = sum(all(b.commits < 2 * MIN_SEGMENT for b in m.benchmarks) for m in histories)
    notes = [host_only_note(machines, short)]
    if settings.statistic != "median":  # every figure below (levels, medians either side, ratios) is of it
        notes.append(f"each run stands by its {settings.statistic} (--statistic {settings.statistic}): the levels "
                     f"either side of a change point are the {settings.statistic}s' medians")
    return History(str(settings.storage), line[-1] if line else "", line, histories, apart, unreadable, root,
                   tuple(note for note in notes if note))


def _check_placed(runs: str, root: str, placed, apart: tuple[Apart, ...], lineage: Lineage) -> None:
    """HistoryError where the history would mislead: a shallow clone that lacks commits the runs name
    (older runs would drop out as if rebased away), or no run placed at all (a history of nothing,
    which would read as `no slowdown`: most often --repo is not the repository that was timed)."""
    missing = sum(a.kind == KINDS[MISSING] for a in apart)
    if lineage.shallow and missing:
        raise HistoryError(f"{root}: a shallow clone, and {missing} of the {runs} name commits it lacks: fetch the "
                           "whole history (git fetch --unshallow; actions/checkout with fetch-depth: 0)")
    if not placed:
        raise HistoryError(f"none of the {runs} has a place on the first-parent line of {root}'s HEAD "
                           f"({kinds_text(apart)}): "
                           "is --repo the repository whose commits were timed?")
