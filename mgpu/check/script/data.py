"""The data of a step at world N against world 1's: which examples every root-model forward consumed,
over all ranks, as per-example digests (padding stripped, the batch dimension found from the
shapes), and what a difference means (no sampler, a per-device batch size, a partial last batch,
another order).

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
from mgpu.check.script.augment import indices_agree, unkeyed_cause
from mgpu.check.script.inrank.inputs import tensor_digest

__all__ = ["StepData", "step_data", "data_divergence", "order_cause", "example_digests", "micro_batches"]


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
    """One digest per example of a forward: its rows of every batched data tensor, padding stripped."""
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
    dims = _batch_dims(f1, fn_all[0] if fn_all else [], n)
    pads = _pads(f1 + [f for fs in fn_all for f in fs], dims)
    per_1 = [example_digests(f, dims, pads) for f in f1]
    per_n = [[example_digests(f, dims, pads) for f in fs] for fs in fn_all]
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
        return ScriptDivergence(step, kind="data",
                          diagnosis="every rank saw the same examples: the data are not sharded over the ranks; give the "
                          "DataLoader a DistributedSampler (or shard the dataset by rank), and keep the global "
                          "batch the same at every world size", detail=f"{tensor}: {sizes}")
    if total_n != total_1 and previous_1 is not None and total_1 < previous_1:
        return ScriptDivergence(step, kind="data",
                          diagnosis=f"the last, partial batch of an epoch: world 1 took {total_1} of the {previous_1} a step "
                          f"holds, world {n} {total_n}: its sampler pads the epoch's end to whole per-rank batches by "
                          "repeating examples (DistributedSampler's padding, accelerate's even_batches); "
                          "drop_last=True keeps every step's global batch the same, or check fewer --steps",
                          detail=f"{tensor}: {sizes}")
    if total_n != total_1:
        hint = ("each rank took a whole world-1 batch: " if total_n == n * total_1 else "")
        # the hint's stand-in global batch (plan.batch_hint's 64) is world 1's, counted here
        arg_hint = arg_hint.replace("{64 // world_size}", f"{{{total_1} // world_size}}").replace(
            "global batch of 64", f"global batch of {total_1}").replace("64 being the global batch",
                                                                         f"{total_1} being world 1's global batch")
        return ScriptDivergence(step, kind="data",
                          diagnosis=f"the global batch changed size: {hint}per-device batch size? Keep the global batch "
                          f"fixed: {arg_hint}", detail=f"{tensor}: {sizes}")
    why = _other_examples(sd, n, step, randomness or {})
    what = ("the global batch's examples differ from world 1's" if indices_agree(sd) else
            "the global batch holds other examples than world 1's")
    return ScriptDivergence(step, kind="data", diagnosis=f"{what} ({shared} of {total_1} shared): {why}",
                      detail=f"{tensor}: {sizes}")


def _other_examples(sd: StepData, n: int, step: int, randomness: dict) -> str:
    """Why a global batch of as many examples holds others than world 1's: the sampler indices and the
    random draws tell first (augment.py), then the samplers (order_cause), then the possible causes."""
    evidence, explained = unkeyed_cause(sd, n, randomness, "")
    if explained or (evidence and indices_agree(sd)):
        return evidence
    order = order_cause(sd, n, step)
    if evidence and "the order agrees" in order:
        order = ""  # the indices say otherwise
    guess = ("the order of the data depends on the world size or the rank (a sampler or shuffle seeded by rank, a "
             "DistributedSampler at one world size only" + (")" if evidence else ", random augmentation drawn per rank?)"))
    return "; ".join(x for x in (evidence, order or guess) if x)


TORCH_RANDOM = "torch.utils.data.sampler.RandomSampler"  # DataLoader(shuffle=True)'s sampler
SEEDABLE = "accelerate.data_loader.SeedableRandomSampler"  # use_seedable_sampler=True's: one order, every world size
_SAME_ORDER = ("give every world size one order: a DistributedSampler(dataset, shuffle=True, seed=S) at every world "
               "size, world 1 included (num_replicas and rank given), with sampler.set_epoch(epoch) each epoch")


def order_cause(sd: StepData, n: int, step: int) -> str:
    """Why the examples differ (as many at both world sizes) from the first step, read from the samplers
    that ordered them (StepData.loaders_*, sampler chains outermost first): accelerate's prepared loader
    shuffling with torch's RandomSampler (no SeedableRandomSampler): use_seedable_sampler; its seedable
    sampler at both world sizes: the order agrees, the examples' content differs; else a shuffle
    (a RandomSampler) at either world size, or another sampler at each: one seeded sampler at every world
    size. '' where the samplers do not tell (no DataLoader seen, a difference that starts later, no
    shuffle and the same sampler at both)."""
    if step != 1 or not sd.loaders_n:
        return ""
    name = lambda c: c.rsplit(".", 1)[-1]  # noqa: E731
    shown = lambda chain: " over ".join(map(name, chain))  # noqa: E731
    for chain in sd.loaders_n:
        if chain and any(c.startswith("accelerate.") for c in chain) and chain[-1] == TORCH_RANDOM:
            return ("another order from the first step, not another sharding: accelerate's prepared DataLoader "
                    f"shuffles with torch's RandomSampler (world {n}: {shown(chain)}), whose order is another draw of "
                    f"torch's random state at each world size (its generator seeded at accelerator.prepare() at {n} "
                    "processes, when the epoch starts at one): use Accelerator(dataloader_config="
                    "DataLoaderConfiguration(use_seedable_sampler=True)) (accelerate.utils), which draws one order "
                    "from the seed at every world size")
    first_1, first_n = (sd.loaders_1[0] if sd.loaders_1 else ()), sd.loaders_n[0]
    if first_n and first_n[-1] == SEEDABLE and (not first_1 or first_1[-1] == SEEDABLE):
        return (f"the order agrees (world {n}: {shown(first_n)}, which draws one order from the seed at every world "
                "size), so the examples themselves differ: a random augmentation drawn per rank (a random crop or "
                "flip in each rank's DataLoader workers, whose random streams start alike on every rank), or a "
                "dataset built otherwise at this world size")
    shuffled = any(c and name(c[-1]) == "RandomSampler" for c in (first_1, first_n))  # not a seeded one
    if not shuffled and (not first_1 or first_1[-1] == first_n[-1]):
        return ""
    return (f"another order from the first step: world 1 orders its data with {shown(first_1) or 'no sampler seen'}, "
            f"world {n} with {shown(first_n)}: " + ("another sampler at each world size" if first_1 and first_1[-1] !=
                                                    first_n[-1] else "a shuffle drawn from another random state") +
            f"; {_SAME_ORDER}")
