"""A gated workload's step counted in this process, as a gate worker counts it: built, warmed up,
one step counted, checked and closed. What the counted baseline saves and checks (counts/plugin.py).

    counts = count_workload({"kind": "train-step", "strategy": "ddp", "devices": 2}, root)
    counts = count_built(spec)   # the same from the current folder (counts/ahead.py's thread)

`counts` is each rank's StepCounts.to_dict, in rank order: one for a workload stepped in this
process, one per rank for a rank pool (ddp, fsdp), whose ranks count their own steps.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["WARMUP_OPS", "count_built", "count_workload"]

# Plain steps before the counted one, as a gate worker takes them: optimizer state made, caches warm,
# and DDP's buckets rebuilt (in its second step: counted after one warm-up step, ddp's step has 2
# broadcasts and 2.8 MB allocated more than every later step).
WARMUP_OPS = 2


def count_built(spec: dict) -> list[dict]:
    """The counted step of a gated workload built here, in the current folder: WARMUP_OPS plain
    steps, then one counted (each rank's counts); the workload's own check (finite losses, weights
    moved) after it."""
    from mgpu_perf.harness.workloads import make_gated

    workload = make_gated(spec)
    try:
        for _ in range(WARMUP_OPS):
            workload.op()
        counts = workload.count(collect_garbage=False)  # nothing is timed after it
        workload.check()
        return counts
    finally:
        workload.close()


def count_workload(spec: dict, root: Path) -> list[dict]:
    """count_built from `root` (where a model's relative path starts). The thread count is given
    back after, so that the next workload does not inherit one set by this one."""
    import torch

    threads, cwd = torch.get_num_threads(), os.getcwd()
    os.chdir(root)
    try:
        return count_built(spec)
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
