"""Causes of the epoch family (--whole-run): the order of the data across epochs, and the ranks' shards
within one. Evidence: each rank's DataLoader passes with their sampler's indices (RankRecord.passes,
recorded by inrank/epochs.py). Each is a failure of the script at any world size, world 1 included.

    data_order_problems(runs, references)   # same_order and shards_apart, over every run that recorded
    same_order(records, world)     # [EpochProblem("epoch-order", "the DataLoader made at train.py:40 ...")]
    shards_apart(run_n, run_1)     # [EpochProblem("shards", "epoch 1: ranks 0 and 1 share 32 example(s) ...")]
    epochs_of(record)              # [{"epoch": 1, "steps": 4, "batches": 4, "ended": "cut after 4 step(s)"}, ...]
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

__all__ = ["EpochProblem", "data_order_problems", "same_order", "shards_apart", "epochs_of", "training_passes"]


@dataclass(frozen=True)
class EpochProblem:
    """A failure --whole-run finds in the order of the data: its kind ("epoch-order", "shards") and its words."""

    name: str
    text: str

    def to_json(self) -> dict:
        return {"name": self.name, "text": self.text}


def training_passes(record) -> list:
    """A rank's passes that fed optimizer steps (its epochs), in order."""
    return [p for p in getattr(record, "passes", []) if p.epoch is not None]


def epochs_of(record) -> list[dict]:
    """Each epoch of a rank: its optimizer steps, batches, and how it ended (cut by the check, its data's end,
    or left by the script); then its evaluation passes (loaders that fed no step) counted."""
    out = []
    for p in training_passes(record):
        ended = (f"cut after {p.steps} step(s)" if p.cut else "its data ran out" if p.exhausted else
                 "the script left it")
        out.append({"epoch": p.epoch, "loader": p.made_at, "steps": p.steps, "batches": p.batches, "ended": ended})
    return out


def _fix(sampler: str) -> str:
    if sampler == "RandomSampler":
        return ("a RandomSampler drawing the same order each epoch is re-seeded before each pass (a generator made "
                "or seeded again in the epoch loop, or torch.manual_seed inside it): seed it once, before the loop")
    return (f"{sampler}.set_epoch is never called: call loader.sampler.set_epoch(epoch) at the start of each epoch "
            "(before iterating the loader); without it the same order is used every epoch, at every world size")


def data_order_problems(runs, references: dict) -> list[EpochProblem]:
    """--whole-run's failures of the order of the data: a shuffling sampler whose later epoch repeats epoch 1's
    order (any world), and ranks whose shards overlap within an epoch (each world N against its world 1's run
    A, from `references`: judge.world_1_references)."""
    done = [r for r in runs if r.failure is None and r.ranks]
    problems = same_order(done)
    for r in done:
        if r.world > 1:
            problems += shards_apart(r, references.get((r.device, r.lifted), {}).get("A"))
    return problems


def same_order(runs) -> list[EpochProblem]:
    """A shuffling sampler whose order in a later epoch equals epoch 1's (their common prefix of indices,
    on the same rank): named with the loader's line, the epochs and the worlds where it was seen."""
    seen: dict = {}   # (made_at, sampler) -> (epochs, worlds, indices compared)
    for run in runs:
        for rec in run.ranks:
            by_loader = collections.defaultdict(list)
            for p in training_passes(rec):
                by_loader[p.loader].append(p)
            for passes in by_loader.values():
                first = passes[0]
                if first.shuffles is not True or not first.indices:
                    continue
                for p in passes[1:]:
                    n = min(len(first.indices), len(p.indices))
                    if n > 1 and p.indices[:n] == first.indices[:n]:
                        epochs, worlds, count = seen.setdefault((first.made_at, first.sampler), (set(), set(), n))
                        epochs.add(p.epoch)
                        worlds.add(run.world)
    out = []
    for (made_at, sampler), (epochs, worlds, n) in seen.items():
        later = ", ".join(map(str, sorted(epochs)))
        out.append(EpochProblem("epoch-order", (
            f"the DataLoader made at {made_at} ({sampler}, shuffling) gives epoch{'s' if len(epochs) > 1 else ''} "
            f"{later} the same order as epoch 1 (the first {n} indices alike, at world{'s' if len(worlds) > 1 else ''} "
            f"{', '.join(map(str, sorted(worlds)))}): {_fix(sampler)}")))
    return out


def shards_apart(run_n, run_1) -> list[EpochProblem]:
    """Within each epoch at world N: examples that more than one rank trained on (where each rank's own
    indices are distinct: a sampler without replacement), and examples of world 1's epoch that no rank of
    world N trained on (over the steps both made), with or without an overlap (a sampler sharded over more
    replicas than ranks misses half the data and overlaps nowhere). One problem per world, the epochs listed."""
    if run_1 is None or not run_1.ranks:
        return []
    ref = {p.epoch: p for p in training_passes(run_1.ranks[0])}
    parts = []
    epochs = sorted({p.epoch for rec in run_n.ranks for p in training_passes(rec)})
    for e in epochs:
        shards = [next((p for p in training_passes(rec) if p.epoch == e), None) for rec in run_n.ranks]
        if any(s is None or not s.indices for s in shards) or any(len(set(s.indices)) != len(s.indices) for s in shards):
            continue
        counts = collections.Counter(i for s in shards for i in set(s.indices))
        shared = sum(1 for c in counts.values() if c > 1)
        missing = len(set(ref[e].indices) - set(counts)) if e in ref and ref[e].steps == shards[0].steps else 0
        if shared:
            parts.append(f"epoch {e}: {shared} example(s) trained on by more than one rank (of {len(counts)} "
                         f"distinct), {missing} of world 1's not trained on by any rank")
        elif missing:
            parts.append(f"epoch {e}: {missing} of world 1's {len(set(ref[e].indices))} example(s) not trained on "
                         f"by any rank (the shards do not overlap; together they hold {len(counts)})")
    if not parts:
        return []
    overlap = any("more than one rank" in part for part in parts)
    return [EpochProblem("shards", (
        f"at world {run_n.world} the ranks' shards {'overlap' if overlap else 'miss examples'}: {'; '.join(parts)} "
        "(from the samplers' indices): each rank must train on its own share of the examples, and the shares "
        "together on world 1's: a DistributedSampler (num_replicas=world size, rank=rank, one seed on every "
        "rank), or a sampler sharded by rank"))]
