"""Causes of the evaluation family (--whole-run): an evaluation pass's coverage at world N against world 1, and
why a figure rank 0 reported differs from world 1's. Evidence: each rank's evaluation passes (sampler indices,
input digests), the script's collectives on the rank's event clock with their small tensors' values, and rank
0's lines (inrank/evaluation.py; counted and lined up by check/script/evaluation.py and figures.py).

    coverage_text(coverage)                          # "the evaluation DataLoader made at train.py:40 ..."
    figure_text(row, world, "mean-of-means", facts)  # "'val accuracy' ...: the plain mean of the ranks' ..."
    unexplained_text(row, world)                     # a figure that differs, no evidence: reported, not failed
    figures_not_compared(comparison, finding_names)  # why no figure of the run was compared, or ""
"""

from __future__ import annotations

__all__ = ["coverage_unreached_text", "coverage_text", "figure_text", "unexplained_text", "figures_not_compared", "training_figures_text"]

_FIX = ("shard the evaluation without padding (a sampler over range(rank, len(dataset), world_size), or "
        "DistributedSampler(drop_last=False) over a set the world size divides), sum the correct counts and the "
        "example counts with dist.all_reduce and divide after; or gather the predictions with accelerate's "
        "gather_for_metrics, which drops the padding")


def coverage_text(c, passes=()) -> str:
    """An evaluation that repeated examples or left some of world 1's out at world N (and the loader's other
    evaluations alike, listed)."""
    parts = []
    if c.duplicates:
        parts.append(f"{c.duplicates} example(s) evaluated more than once (the sampler pads each rank's shard to "
                     "one size with repeats)")
    if c.missing:
        parts.append(f"{c.missing} of world 1's example(s) evaluated by no rank (drop_last=True drops each rank's "
                     "partial last batch, or the split leaves them out)")
    fix = _FIX if c.duplicates else ("evaluate every example: drop_last=False in the evaluation DataLoader (and its "
                                     "sampler), and a split that gives every example to one rank")
    dataset = f" of a dataset of {c.dataset}" if c.dataset is not None else ""
    which = f"evaluations {', '.join(map(str, passes))}" if len(passes) > 1 else f"evaluation {c.number}"
    return (f"the evaluation DataLoader made at {c.made_at} ({which}) covered {c.seen} example(s) at world "
            f"{c.world} ({', '.join(map(str, c.shards))} per rank, {c.distinct} distinct) against world 1's "
            f"{c.reference}{dataset}: {'; '.join(parts)} (from the {c.by}); a figure reduced over it counts the "
            f"repeats and misses the left-out: {fix}")


def coverage_unreached_text(coverage: str, alike: int) -> str:
    """A coverage problem whose figures are all world 1's: said, not failed."""
    return (f"{coverage}. Not failed: rank 0 gathered in the evaluation and every figure it printed from it ({alike}) "
            "is world 1's: the repeats were cut off before the figures (as gathering and truncating to the dataset's "
            "length does)")


def _head(row, world: int) -> str:
    return (f"the figure '{row.label}' (\"{row.line}\") is {row.world_n.text} at world {world} and "
            f"{row.world_1.text} at world 1 (and its rerun)")


def figure_text(row, world: int, cause: str, facts: dict, more: int = 0) -> str:
    """A figure that differs, with the evidence of its cause (evaluation.figure_evidence); `more` later lines of the
    same figure that differ for the same cause."""
    return _figure_text(row, world, cause, facts) + (f" (and in {more} later line(s) alike)" if more else "")


def _figure_text(row, world: int, cause: str, facts: dict) -> str:
    head = _head(row, world)
    c = facts.get("collective")
    if cause == "coverage":
        k = facts["coverage"]
        return (f"{head}: its evaluation (the DataLoader made at {k.made_at}, evaluation {k.number}) evaluated "
                f"{k.duplicates} example(s) more than once and left {k.missing} out (coverage)")
    if cause == "mean-of-means":
        values = ", ".join(f"{v:.6g}" for v in facts["values"])
        return (f"{head}: it is the plain mean of the ranks' values ({values}, {c.op} {c.reduce} at {c.where}) over "
                f"shards of {', '.join(map(str, facts['sizes']))} example(s): a mean of per-rank means over unequal "
                f"shards; weighted by the shard sizes it is {facts['weighted']:.6g}, what world 1 computes: reduce "
                "the sums and the counts (dist.all_reduce of [correct, count]) and divide after")
    if cause == "sum-of-means":
        values = ", ".join(f"{v:.6g}" for v in facts["values"])
        return (f"{head}: it is the sum of the ranks' per-rank values ({values}, {c.op} SUM at {c.where}), about "
                f"{world} times world 1's: a sum of means; reduce the sums and the counts and divide the total by "
                "the total count")
    if cause == "reduced-twice":
        return (f"{head}: the tensor reduced at {c.where} was reduced {facts['times']} times between the evaluation "
                "and the line: an accumulator all-reduced twice is multiplied by the world size (or added to "
                "itself); reduce it once, after the evaluation")
    if cause == "rank-0-shard":
        return (f"{head}: rank 0 printed it from its own shard ({facts['shard']} of world 1's {facts['whole']} "
                f"example(s) of the DataLoader made at {facts['loader']}), with no collective between the "
                "evaluation and the line: reduce the sums and the counts over the ranks (dist.all_reduce) before "
                "printing, or gather the predictions (all_gather, gather_for_metrics)")
    return f"{head}: {cause}"


def unexplained_text(row, world: int) -> str:
    """A figure that differs with no evidence of a cause: reported with both values, not failed."""
    return (f"{_head(row, world)}: no evidence of a cause (coverage, the reduction across ranks, rank 0's shard): "
            "reported, not failed (an evaluation moves in whole examples: one prediction flipped by rounding moves "
            "it)")


def training_figures_text(rows, world: int) -> str:
    """Figures printed during training (after training batches, no evaluation between) that differ: one note."""
    first = rows[0]
    return (f"{len(rows)} figure(s) rank 0 printed during training differ at world {world} (the first: "
            f"'{first.label}' {first.world_n.text} against world 1's {first.world_1.text}, \"{first.line}\"): "
            "figures of rank 0's own batches, not of an evaluation: reported (the JSON lists them), not failed")


def figures_not_compared(comparison, finding_names) -> str:
    """Why the figures of a world were not compared ("" where they were): training data world N cannot make
    world 1's (random numbers drawn per rank), or training that did not match."""
    world = f"world {comparison.world}" if comparison is not None else "world N"
    if "randomness" in finding_names:   # draws beyond dropout (which the check switches off)
        return (f"{world}: the figures rank 0 reported were not compared: the script draws random numbers per rank "
                "(finding randomness), so world N's training (and any evaluation batch drawn per rank) cannot be "
                "world 1's")
    if comparison is None or comparison.status == "pass":
        return ""
    if comparison.status == "fail":
        return (f"{world}: the figures rank 0 reported were not compared: its training parts from world 1's "
                "(above), so its figures cannot match")
    if comparison.status == "finding":
        return f"{world}: the figures rank 0 reported were not compared: its training differs from world 1's for a known reason (above)"
    return f"{world}: the figures rank 0 reported were not compared: {comparison.reason or 'not compared'}"
