"""Causes of the randomness family: random numbers drawn in the forward or the training step (each rank
draws its own for its shard), and random augmentation the check cannot key to the example. Evidence:
RankRecord.random_draws and randomness (inrank/draws.py, inrank/keyed.py), merged by augment.py
(randomness_facts), and the dataset indices each sampler yielded (augment.indices_agree)."""

from __future__ import annotations

import collections

from mgpu.check.script.augment import indices_agree, not_keyed

__all__ = ["NOT_KEYED", "explained", "unkeyed_cause", "unreproducible_unkeyed"]

# Every data divergence that randomness the check cannot key explains holds these words (compare.py
# reports it as NOT VERIFIED, not a failure).
NOT_KEYED = "random numbers the check cannot key to the example"


def explained(facts) -> str:
    """A known reason for world N to differ, from the findings (ScriptFacts): randomness in the forward.
    (BatchNorm is no reason: the check synchronises it over the ranks at world N, batchnorm.SyncedBatchNorm.)"""
    if facts.random_draws:
        what = ", ".join(f"{k} ({v} calls)" for k, v in sorted(facts.random_draws.items()))
        return (f"the forward draws random numbers beyond dropout ({what}): each rank draws its own for its shard, "
                "so world N cannot match world 1 exactly (randomness finding)")
    step = {k: e for k, e in (facts.randomness or {}).get("step", {}).items() if not e.get("own")}
    if step:  # from the global generators only: a generator of the script's own may draw alike at every world size
        what = "; ".join(f"{k} at {e['site']}" for k, e in sorted(step.items()))
        return (f"the training step draws random numbers outside the model ({what}): each rank draws its own for its "
                "shard, so world N cannot match world 1 exactly (randomness finding)")
    return ""


def _indices_shared(sd) -> str:
    one = collections.Counter(i for batch in sd.indices_1 for i in batch)
    union = collections.Counter(i for r in sd.indices_n for batch in r for i in batch)
    return f"{sum((one & union).values())} of {sum(one.values())}"


_WHAT_TO_DO = ("to compare, draw them from the example (keyed by its index, as the check does for a Dataset's "
               "global generators), move them into the Dataset's __getitem__, or switch them off for the check "
               "(a flag of the script)")


def unkeyed_cause(sd, n: int, facts: dict, shared: str) -> tuple[str, bool]:
    """(why the examples differ, whether randomness the check cannot key explains it: NOT VERIFIED) for a
    step whose global batch holds other examples than world 1's, as many; ('', False) where the evidence
    says nothing (causes/data.py then gives its own causes)."""
    agree = indices_agree(sd)
    unkeyed = not_keyed(facts)
    if agree is False:
        return (f"world {n}'s samplers yielded other dataset indices than world 1's ({_indices_shared(sd)} shared): "
                "other examples, not the same ones augmented otherwise", False)
    if agree:
        if unkeyed:
            return (f"the same examples as world 1's (every rank's sampler indices together are world 1's), "
                    f"with other contents: {NOT_KEYED}: {'; '.join(unkeyed)}: each process draws them for its own "
                    f"examples, in its own order, so world {n} cannot match world 1's data; {_WHAT_TO_DO}", True)
        return ("the same examples as world 1's (every rank's sampler indices together are world 1's), with "
                "other contents, and no random draw the check could not key: the dataset computes them otherwise at "
                "this world size (statistics over a rank's shard, a file or cache per rank?)", False)
    iterable = [u for u in unkeyed if u.startswith("an IterableDataset")]
    if iterable:
        return (f"{NOT_KEYED}: {'; '.join(iterable)}: each rank draws for its own examples, so world {n} cannot match "
                "world 1's data; to compare, draw them from the example (a key of its own: a file name, a position in "
                "the stream), or a map-style Dataset (whose __getitem__ the check keys), or switch them off for the "
                "check", True)
    steps = [u for u in unkeyed if " in the training step at " in u]
    if steps:
        return (f"the examples are drawn at random in the training step ({'; '.join(steps)}): {NOT_KEYED}; each "
                f"rank draws its own (seeded by rank, or not at all), so world {n} cannot take world 1's examples: "
                "a choice, not a bug; to compare, draw the global batch from a generator seeded alike at every world "
                "size and take this rank's share of it (rows rank::world_size)", True)
    return "", False


def unreproducible_unkeyed(diagnosis: str, unkeyed: list) -> str:
    """Two world-1 runs took other examples (`diagnosis`), and the data draw random numbers the check
    cannot key (augment.not_keyed): said with them."""
    return (f"{diagnosis}; the data's random numbers the check cannot key to the example: {'; '.join(unkeyed)} "
            "(seeding them makes world 1 reproducible, not world N comparable)")
