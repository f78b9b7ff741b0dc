"""Why world N parts from world 1: the cause a divergence's evidence supports (a common factor
between the gradients or the updates, micro-batches, a normaliser per rank, randomness), and the
facts about the script that the judge learned from every rank's record (ScriptFacts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mgpu.scriptcheck.data import StepData
from mgpu.scriptcheck.tensors import FACTOR_AGREE, common_factor, name_factor

__all__ = ["ScriptFacts", "gradient_diagnosis", "update_diagnosis", "explained"]


@dataclass(frozen=True)
class ScriptFacts:
    """What the judge learned of the script from every rank's record that explains a divergence."""

    batchnorm: tuple = ()        # BatchNorm modules normalising per rank (synchronised by the check at world N)
    random_draws: dict = field(default_factory=dict)   # torch function -> draws inside a forward, beyond dropout


def gradient_diagnosis(got: dict, ref: dict, n: int, sd: StepData, facts: ScriptFacts) -> str:
    c = common_factor(got, ref)
    if c is not None and abs(c - 1) <= FACTOR_AGREE:
        c = None  # world 1's gradients, only further off than rounding: no factor to name
    if c is not None:
        name = name_factor(c, n)
        causes = {
            "1/N": "the average over ranks divided once more (the loss divided by a global count or by the world "
                   "size, then DDP's average, or an all_reduce that averages, on top)",
            "1/sqrt(N)": "a norm reduced twice (the gradient norm for clipping all-reduced over ranks that already "
                         "hold the whole gradient: clipping cuts too much)",
            "N": "summed over ranks, not averaged (an all_reduce with SUM and no division by the world size, or "
                 "the loss multiplied by the world size)",
            "sqrt(N)": "a norm divided by the world size's square root (clipping by a norm that is too small)",
        }
        if name:
            return f"every gradient is {c:.3f} x world 1's = {name}: {causes[name]}"
        return (f"every gradient is {c:.3f} x world 1's, a common factor that is no power of N: a loss scale or "
                "normaliser that changes with the world size (a count taken per rank, clipping by a norm that "
                "differs)?")
    extra = explained(facts)
    if extra:
        return extra
    micro = max(sd.forwards_n) if sd.forwards_n else 1
    if micro > 1 or sd.forwards_1 > 1:
        return (f"the gradients differ by no common factor, and the step accumulated {sd.forwards_1} forward(s) at "
                f"world 1, {micro} per rank at world {n}: the loss is weighted per micro-batch or per rank (each "
                "micro-batch's or rank's mean over its own tokens or examples, divided by the number of "
                "micro-batches): divide the summed loss by the count over the whole window and all ranks "
                "(all-reduced), times the world size where DDP averages")
    return (f"the gradients differ by no common factor: the loss weighs examples differently at world {n}: a mean "
            "or normaliser per rank (each rank divides by its own count of tokens, boxes, foreground "
            "examples...): divide the summed loss by the global count (all-reduced), times the world size "
            "where DDP averages")


def explained(facts: ScriptFacts) -> str:
    """A known reason for world N to differ, from the findings: randomness in the forward. (BatchNorm
    is no reason: the check synchronises it over the ranks at world N, batchnorm.SyncedBatchNorm.)"""
    if facts.random_draws:
        what = ", ".join(f"{k} ({v} calls)" for k, v in sorted(facts.random_draws.items()))
        return (f"the forward draws random numbers beyond dropout ({what}): each rank draws its own for its shard, "
                "so world N cannot match world 1 exactly (randomness finding)")
    return ""


def update_diagnosis(got: tuple[dict, dict], ref: tuple[dict, dict], n: int, facts: ScriptFacts) -> str:
    """Why the weights part although the gradients agree; got and ref: (weights before, after) the step."""
    def upd(after, before):
        return {k: (a.double() - before[k].double()) for k, a in after.items()
                if isinstance(a, torch.Tensor) and isinstance(before.get(k), torch.Tensor)}
    c = common_factor(upd(got[1], got[0]), upd(ref[1], ref[0]))
    if c is not None and abs(c - 1) > FACTOR_AGREE:
        name = name_factor(c, n)
        return (f"the gradients agree, but every update is {c:.3f} x world 1's" + (f" = {name}" if name else "") +
                ": the learning rate (or another optimizer setting) changes with the world size (a linear "
                "scaling rule?)")
    return explained(facts) or (
        "the gradients agree, but the optimizer step does not: an optimizer setting, its state or the schedule "
        "depends on the world size")
