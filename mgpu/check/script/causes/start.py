"""Causes of the start: the weights before step 1 (uninitialised memory, an unseeded or per-shard
initialisation, replicas not broadcast), and a world N that never became one (no process group, no
optimizer step). Evidence: RankRecord.uninitialised and init_digests (inrank/evidence.py), the weights
before step 1, StepRecord.process_group."""

from __future__ import annotations

import torch

__all__ = ["UNINITIALISED", "uninitialised_cause", "unseeded_start", "replicas_apart", "missing_at_start",
           "other_start", "no_process_group", "no_step"]

# The start of the reproducibility cause for weights that hold uninitialised memory (report.py says no "seed it").
UNINITIALISED = "uninitialised memory"


def uninitialised_cause(records) -> str:
    """The cause where weights held uninitialised memory when their model was first called
    (RankRecord.uninitialised, evidence.suspect_values), in any of the records; '' where none did."""
    worst = None
    for r in records:
        for name, (bad, largest) in r.uninitialised.items():
            key = (bad > 0, largest)
            if worst is None or key > worst[0]:
                worst = (key, name, bad, largest)
    if worst is None:
        return ""
    _, name, bad, largest = worst
    held = " and ".join(part for part in (f"{bad} NaN or inf value(s)" if bad else "",
                                          f"values up to {largest:.1e}" if largest else "") if part)
    return (f"{UNINITIALISED}: parameter {name} holds {held} when its model is first called: memory no "
            "initialisation wrote (torch.empty, or to_empty() without reset_parameters), which differs from run "
            "to run and rank to rank although the script is seeded: initialise it (reset_parameters or the "
            "model's init_weights after to_empty)")


def unseeded_start(records) -> str:
    """Why two world-1 runs start from other weights (the records of both): uninitialised memory, else
    an initialisation that is not seeded."""
    return uninitialised_cause(records) or ("two world-1 runs start from other weights: the model's initialisation "
                                            "is not seeded")


def replicas_apart() -> str:
    """Why world N's ranks hold other weights before step 1."""
    return ("replicas start apart: broadcast rank 0's weights before training (DDP does at construction; a "
            "hand-made loop must dist.broadcast every parameter), or build the model from the same seed on every "
            "rank")


def missing_at_start(n: int, name: str) -> str:
    """World N's optimizer lacks a parameter world 1's holds."""
    return f"world {n} has no parameter {name} in its optimizer"


def other_start(got, n: int) -> str:
    """Why world N starts from other weights: shards each initialised from one seed (the whole tensor
    is n bitwise-equal blocks along dim 0), or another random state."""
    if torch.is_tensor(got) and got.dim() >= 1 and got.shape[0] % n == 0 and got.shape[0] >= n and got.numel() > n:
        blocks = got.chunk(n, dim=0)
        if all(torch.equal(blocks[0], b) for b in blocks[1:]):
            rows = got.shape[0] // n
            return (f"world {n} starts from other weights than world 1: each rank initialised its own shard from one "
                    f"seed (rows {rows}-{2 * rows - 1} of world {n}'s tensor repeat rows 0-{rows - 1} bitwise), so the "
                    "whole tensor is its shard n times over: initialise the model before sharding it (fully_shard, "
                    "FSDP), or load a full state dict from rank 0 (broadcast_from_rank0)")
    return (f"world {n} starts from other weights than world 1: the model is built from another random state at this "
            "world size; seed before building it, with the same seed at every world size (not seed + rank), or load "
            "the same checkpoint")


def no_process_group(ranks, n: int) -> str:
    """The cause where no rank of a world-N run had a process group of more than one rank at any
    step (StepRecord.process_group): each rank trained its own copy; '' otherwise or unknown."""
    sizes = [s.process_group for r in ranks for s in r.steps]
    if n <= 1 or not sizes or None in sizes or max(sizes) > 1:
        return ""
    what = ("torch.distributed was never initialised in any rank" if max(sizes) == 0 else
            "every rank's process group had world size 1")
    return (f"no process group at world {n}: {what}, so each of the {n} ranks trained its own copy of the model "
            "(a wrapper that picked a single device under torchrun?): initialise the process group "
            "(torch.distributed.init_process_group, or the wrapper's distributed strategy) so that the ranks "
            "share their gradients")


def no_step(world: int) -> str:
    """World N made no optimizer step where world 1 did."""
    return (f"world {world} made no optimizer step where world 1 did: does the script take another path when "
            "distributed?")
