"""The data of a step at world N against world 1's: which examples every root-model forward consumed,
over all ranks, as per-example digests (padding stripped, the batch dimension found from the
shapes), and the divergence where they differ (what a difference means, no sampler, a per-device
batch size, a partial last batch, another order, is causes/data.py's).

    sd = step_data(world_1_record, world_n_records, n)
    divergence = data_divergence(step, sd, n, "Net", arg_hint)    # None: the same examples
"""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass, field

import torch

from mgpu.check.script.divergence import ScriptDivergence
from mgpu.check.script.inrank.records import ForwardRecord, StepRecord
from mgpu.check.script.causes.data import batch_changed, not_sharded, other_examples, partial_last_batch
from mgpu.check.script.inrank.inputs import tensor_digest

__all__ = ["StepData", "step_data", "data_divergence", "example_digests", "forward_digests", "micro_batches"]


def _batch_dims(forwards_1: list, forwards_n: list, n: int) -> dict:
    """slot -> the dimension along which its examples lie: the one whose size at world 1 is N times
    world N's (the global batch split over the ranks); dim 0 when none is (or cannot be told)."""
    dims = {}
    for f1 in forwards_1[:1]:
        for fn in forwards_n[:1]:
            for key, t1 in f1.tensors.items():
                tn = fn.tensors.get(key)
                if not isinstance(t1, torch.Tensor) or not isinstance(tn, torch.Tensor) or t1.dim() != tn.dim():
                    continue
                hits = [d for d in range(t1.dim()) if t1.shape[d] == n * tn.shape[d] and tn.shape[d] > 0]
                if hits and 0 not in hits:
                    dims[key] = hits[0]
    return dims


def _pads(forwards: list, dims: dict) -> dict:
    """slot -> (value stripped from the end of each example, value stripped from its start), for 2-D
    integer and bool tensors (token ids, masks, labels): the most common last and first element,
    which is the padding where a batch is padded to its longest example, and harmless otherwise."""
    ends, starts = collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter)
    for f in forwards:
        for key, t in f.tensors.items():
            if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point() and not t.is_complex():
                rows = t if dims.get(key, 0) == 0 else t.t()
                if rows.shape[1]:
                    ends[key].update(rows[:, -1].tolist())
                    starts[key].update(rows[:, 0].tolist())
    return {k: (ends[k].most_common(1)[0][0], starts[k].most_common(1)[0][0]) for k in ends}


def _strip(row: torch.Tensor, pad: tuple) -> torch.Tensor:
    end, start = pad
    n = row.numel()
    hi = n
    vals = row.tolist()
    while hi > 0 and vals[hi - 1] == end:
        hi -= 1
    lo = 0
    while lo < hi and vals[lo] == start:
        lo += 1
    return row[lo:hi]


def example_digests(forward: ForwardRecord, dims: dict, pads: dict) -> list[str]:
    """One digest per example of a forward: its rows of every batched data tensor, padding stripped (a
    forward with none batched: one digest of its tensors stacked)."""
    tensors = forward.tensors
    sizes = collections.Counter()
    for key, t in tensors.items():
        if isinstance(t, torch.Tensor):
            if t.dim():
                sizes[t.shape[dims.get(key, 0)]] += 1
        else:
            sizes[len(t[1])] += 1
    if not sizes:
        return [tensor_digest(torch.stack([t for t in tensors.values() if isinstance(t, torch.Tensor)]))]
    count = sizes.most_common(1)[0][0]
    hashes = [hashlib.sha1() for _ in range(count)]
    for key in sorted(tensors):
        t = tensors[key]
        if isinstance(t, torch.Tensor):
            if not t.dim() or t.shape[dims.get(key, 0)] != count:
                continue
            rows = t.movedim(dims.get(key, 0), 0)
            for i in range(count):
                row = rows[i]
                if key in pads and row.dim() == 1:
                    row = _strip(row, pads[key])
                hashes[i].update(key.encode() + tensor_digest(row).encode())
        elif len(t[1]) == count:
            for i in range(count):
                hashes[i].update(key.encode() + t[1][i].encode())
    return [h.hexdigest() for h in hashes]


def forward_digests(forwards_1: list, forwards_n: list[list], n: int, rerun: list = ()) -> tuple:
    """Every forward's example digests by one rule: world 1's forwards, each world-N rank's (a list of
    lists), and those of world 1's rerun (locate.py's run B); the batch dimension told from world 1's first
    forward against rank 0's, the padding from them all. (digests_1, digests_n, digests_rerun)."""
    dims = _batch_dims(forwards_1, forwards_n[0] if forwards_n else [], n)
    pads = _pads(forwards_1 + list(rerun) + [f for fs in forwards_n for f in fs], dims)
    digests = lambda forwards: [example_digests(f, dims, pads) for f in forwards]  # noqa: E731
    return digests(forwards_1), [digests(fs) for fs in forwards_n], digests(rerun)


@dataclass
class StepData:
    world_1: list            # digests, in order
    ranks: list              # per rank: digests, in order
    forwards_1: int
    forwards_n: list         # per rank: forwards in this step
    micro_1: int = 1         # micro-batches at world 1 (micro_batches: not every forward is one)
    micro_n: list = field(default_factory=list)   # per rank
    loaders_1: tuple = ()    # world 1's DataLoaders iterated by the step, each its sampler chain (feeds.sampler_chain)
    loaders_n: tuple = ()    # world N rank 0's
    indices_1: list | None = None   # world 1's batches of dataset indices delivered for the step (keyed.py)
    indices_n: list | None = None   # per rank: its batches of dataset indices


def micro_batches(rec: StepRecord, digests: list[list[str]]) -> int:
    """How many micro-batches a step's forwards are (digests: each forward's examples). A micro-batch
    is the forwards between two backward passes, over examples no other micro-batch holds: forwards
    that fed one backward (a contrastive pair's two views, a teacher and a student) are one, and
    forwards that repeat examples are views of one batch, not micro-batches. Where the rank counted
    no backward after the last forward (`torch.autograd.backward` called directly), each forward is
    taken for its own backward pass."""
    forwards = rec.forwards
    if not forwards:
        return 0
    marks = [f.backwards for f in forwards]
    counted = rec.backwards is not None and None not in marks and rec.backwards > max(marks)
    groups: dict = {}
    for i, (mark, examples) in enumerate(zip(marks, digests)):
        groups.setdefault(mark if counted else i, []).extend(examples)
    distinct = set().union(*map(set, groups.values()))
    if len(distinct) < sum(len(set(g)) for g in groups.values()):
        return 1  # an example in two of them: one batch seen again
    return len(groups)


def step_data(rec_1: StepRecord, recs_n: list[StepRecord], n: int) -> StepData:
    """The examples of one step at world 1 and on every rank at world n."""
    f1 = rec_1.forwards
    fn_all = [r.forwards for r in recs_n]
    per_1, per_n, _ = forward_digests(f1, fn_all, n)
    return StepData([d for ds in per_1 for d in ds], [[d for ds in per for d in ds] for per in per_n], len(f1),
                    [len(fs) for fs in fn_all], micro_batches(rec_1, per_1),
                    [micro_batches(r, per) for r, per in zip(recs_n, per_n)], tuple(rec_1.loaders),
                    tuple(recs_n[0].loaders) if recs_n else (), rec_1.indices,
                    [r.indices for r in recs_n])


def data_divergence(step: int, sd: StepData, n: int, root: str, arg_hint: str,
                     previous_1: int | None = None, randomness: dict | None = None) -> ScriptDivergence | None:
    """The data of one step at world N against world 1's; `previous_1`: world 1's examples in the step
    before (a smaller step after it is an epoch's partial last batch); `randomness`: the script's random
    draws (augment.randomness_facts), which tell other examples from the same ones drawn otherwise."""
    c1 = collections.Counter(sd.world_1)
    union = collections.Counter()
    for r in sd.ranks:
        union.update(r)
    if union == c1:
        return None
    total_1, total_n = sum(c1.values()), sum(union.values())
    shared = sum((union & c1).values())
    tensor = f"inputs of {root}"
    per_rank = [len(r) for r in sd.ranks]
    sizes = f"world 1 took {total_1} example(s) in {sd.forwards_1} forward(s); world {n} took {total_n} " \
            f"({' + '.join(map(str, per_rank))} on ranks 0..{n - 1})"
    same_everywhere = n > 1 and all(collections.Counter(r) == collections.Counter(sd.ranks[0]) for r in sd.ranks[1:]) \
        and sd.ranks[0]
    if same_everywhere:
        return ScriptDivergence(step, kind="data", diagnosis=not_sharded(), detail=f"{tensor}: {sizes}")
    if total_n != total_1 and previous_1 is not None and total_1 < previous_1:
        return ScriptDivergence(step, kind="data", diagnosis=partial_last_batch(n, (total_1, total_n), previous_1),
                                detail=f"{tensor}: {sizes}")
    if total_n != total_1:
        return ScriptDivergence(step, kind="data", diagnosis=batch_changed(n, (total_1, total_n), arg_hint),
                                detail=f"{tensor}: {sizes}")
    why = other_examples(sd, n, step, randomness or {}, (shared, total_1))
    return ScriptDivergence(step, kind="data", diagnosis=why, detail=f"{tensor}: {sizes}")
