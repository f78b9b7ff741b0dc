"""The counted baseline's rank workloads counted ahead (counts/plugin.py): a workload whose steps
run in rank processes (ddp, fsdp) is counted by one background thread while pytest counts the
in-process ones, so that the fork server's imports, the ranks' start and their steps use the cores
that the in-process steps (one thread each, on a CPU) leave idle, instead of running after them.

    ahead = CountsAhead(count_built, {nodeid: spec, ...})   # those that spawn ranks, in pytest's order
    counts = ahead.result(nodeid)                          # waits; raises what counting it raised
    ahead.close()                                          # what has not begun is cancelled

The thread only waits on the ranks' queues: each rank pool is built, stepped, counted and closed
there as pytest's thread would (one pool at a time), and the counts are the ranks' own, so they are
the same as counted in order. Not where the steps run on GPUs (the two lanes would share a device's
memory), nor where pytest's folder is not the current one (a process has one current folder, and
the in-process lane changes it: counts/workload.py's count_workload).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

__all__ = ["CountsAhead", "spawns_ranks_of", "in_process_first", "can_count_ahead"]


def spawns_ranks_of(spec: dict) -> bool:
    """Whether a gated workload's steps run in rank processes: its strategy is one process per
    device (ddp, fsdp). A workload with no strategy (matmul), or one this mgpu does not know (its
    test fails as it would in order), is counted in pytest's process."""
    from mgpu_perf.harness.ranks import spawns_ranks

    strategy = spec.get("strategy")
    if not isinstance(strategy, str):
        return False
    try:
        return spawns_ranks(strategy)
    except Exception:  # an unknown strategy: make_gated says so, in the test
        return False


def in_process_first(items: list, ahead: set) -> list:
    """The items counted in pytest's process first, then those counted ahead, each in its own order:
    the in-process lane then runs beside the ranks' for as long as it can."""
    return [i for i in items if i.nodeid not in ahead] + [i for i in items if i.nodeid in ahead]


def can_count_ahead(root: Path) -> tuple[bool, str]:
    """(whether, and if not why): only on a CPU, and only where `root` (pytest's folder, where a
    model's relative path starts) is the current folder."""
    import torch

    if torch.cuda.is_available():
        return False, "the steps run on GPUs: the ranks and pytest's process would share a device's memory"
    if Path.cwd().resolve() != Path(root).resolve():
        return False, f"the current folder is not pytest's ({root})"
    return True, ""


class CountsAhead:
    """`count(spec)` of each spec, one after another in one background thread, started at once."""

    def __init__(self, count: Callable[[dict], list], specs: dict[str, dict]):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mgpu-counts-ahead")
        self._futures: dict[str, Future] = {nodeid: self._pool.submit(count, spec) for nodeid, spec in specs.items()}

    def __contains__(self, nodeid: str) -> bool:
        return nodeid in self._futures

    def result(self, nodeid: str) -> list:
        """The workload's counts (each rank's), once counted; what counting it raised, raised here."""
        return self._futures[nodeid].result()

    def close(self) -> None:
        """At the session's end (or when it stops early): the workloads not begun are cancelled, the
        one being counted finishes (its ranks are closed as it ends)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
