"""Causes of the data family: a step's examples at world N against world 1's (data.py tells whether they
differ; these say why). Evidence: the per-example digests and micro-batches of a step (data.StepData),
the sampler chain of each DataLoader iterated (inrank/feeds.py), the dataset indices each sampler
yielded and the random draws (causes/randomness.py), the script's batch option (plan.batch_hint)."""

from __future__ import annotations

from mgpu.check.script.augment import indices_agree
from mgpu.check.script.causes.randomness import unkeyed_cause

__all__ = ["not_sharded", "partial_last_batch", "batch_changed", "other_examples", "order_cause", "another_order",
           "unseeded_data", "TORCH_RANDOM", "SEEDABLE"]


def not_sharded() -> str:
    """Every rank of world N saw the same examples."""
    return ("every rank saw the same examples: the data are not sharded over the ranks; give the DataLoader a "
            "DistributedSampler (or shard the dataset by rank), and keep the global batch the same at every world size")


def partial_last_batch(n: int, totals: tuple[int, int], previous_1: int) -> str:
    """An epoch's last batch, smaller at world 1 (totals: world 1's examples, world N's) than the step
    before it (previous_1), padded at world N."""
    total_1, total_n = totals
    return (f"the last, partial batch of an epoch: world 1 took {total_1} of the {previous_1} a step holds, world {n} "
            f"{total_n}: its sampler pads the epoch's end to whole per-rank batches by repeating examples "
            "(DistributedSampler's padding, accelerate's even_batches); drop_last=True keeps every step's global batch "
            "the same, or check fewer --steps")


def batch_changed(n: int, totals: tuple[int, int], arg_hint: str) -> str:
    """The global batch holds another number of examples at world N (totals: world 1's, world N's);
    arg_hint: the script's batch option as an expression of world_size (plan.batch_hint)."""
    total_1, total_n = totals
    hint = ("each rank took a whole world-1 batch: " if total_n == n * total_1 else "")
    # the hint's stand-in global batch (plan.batch_hint's 64) is world 1's, counted here
    arg_hint = arg_hint.replace("{64 // world_size}", f"{{{total_1} // world_size}}").replace(
        "global batch of 64", f"global batch of {total_1}").replace("64 being the global batch",
                                                                     f"{total_1} being world 1's global batch")
    return f"the global batch changed size: {hint}per-device batch size? Keep the global batch fixed: {arg_hint}"


def other_examples(sd, n: int, step: int, randomness: dict, shared: tuple[int, int]) -> str:
    """As many examples as world 1's, others (sd: data.StepData; shared: the examples both hold, world
    1's count): the sampler indices and the random draws tell first (randomness.unkeyed_cause), then the
    samplers (order_cause), then the possible causes."""
    what = ("the global batch's examples differ from world 1's" if indices_agree(sd) else
            "the global batch holds other examples than world 1's")
    return f"{what} ({shared[0]} of {shared[1]} shared): {_why_others(sd, n, step, randomness)}"


def _why_others(sd, n: int, step: int, randomness: dict) -> str:
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


def order_cause(sd, n: int, step: int) -> str:
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


def another_order() -> str:
    """World N's optimizers step in another order than world 1's."""
    return "the optimizers step in another order at this world size"


def unseeded_data() -> str:
    """Two world-1 runs took other examples at a step."""
    return "two world-1 runs took other examples: the data order (or an augmentation) is not seeded"
