"""Causes of the gradients: a common factor between world N's gradients and world 1's (a power of N,
or none), micro-batches or a normaliser weighted per rank, gradients not synchronised over the ranks,
a parameter without a gradient; and a divergence of the trajectory traced back to the step where it
first drifted. Evidence: the gradients the optimizer saw (tensors.common_factor, name_factor), the
step's forwards and micro-batches (data.StepData), the facts (facts.ScriptFacts)."""

from __future__ import annotations

from mgpu.check.script.causes.collectives import collective_gradients
from mgpu.check.script.causes.randomness import explained
from mgpu.check.script.tensors import FACTOR_AGREE, RESIDUAL, common_factor, name_factor

__all__ = ["gradient_diagnosis", "FACTOR_CAUSES", "ranks_apart", "missing_in_optimizer", "unused_parameter", "traced"]

# A common factor of the gradients, named (tensors.name_factor) -> what makes it.
FACTOR_CAUSES = {
    "1/N": "the average over ranks divided once more (the loss divided by a global count or by the world "
           "size, then DDP's average, or an all_reduce that averages, on top)",
    "1/sqrt(N)": "a norm reduced twice (the gradient norm for clipping all-reduced over ranks that already "
                 "hold the whole gradient: clipping cuts too much)",
    "N": "summed over ranks, not averaged (an all_reduce with SUM and no division by the world size, or "
         "the loss multiplied by the world size)",
    "sqrt(N)": "a norm divided by the world size's square root (clipping by a norm that is too small)",
}


def gradient_diagnosis(got: dict, ref: dict, n: int, sd, facts) -> str:
    """Why world N's gradients (got, name -> tensor) part from world 1's (ref); sd: the step's data
    (data.StepData: forwards and micro-batches), facts: facts.ScriptFacts."""
    c = common_factor(got, ref)
    near_one = c is not None and abs(c - 1) <= FACTOR_AGREE
    if near_one:
        c = None  # world 1's gradients, only further off than the tolerance: no factor to name
    if c is not None:
        name = name_factor(c, n)
        if name:
            return f"every gradient is {c:.3f} x world 1's = {name}: {FACTOR_CAUSES[name]}"
        return (f"every gradient is {c:.3f} x world 1's, a common factor that is no power of N: a loss scale or "
                "normaliser that changes with the world size (a count taken per rank, clipping by a norm that "
                "differs)?")
    if facts.collectives:
        return collective_gradients(facts.collectives)
    extra = explained(facts)
    if extra:
        return extra
    if near_one:
        return (f"every gradient is world 1's to within {RESIDUAL:.0%} (no factor of the world size), yet further "
                "apart than the tolerance: a small difference, made in the backward's sums over the examples (another "
                "summation order, whose rounding world 1's rerun showed smaller than it is here) or a small weight "
                "that differs per rank (a count that differs a little between the ranks' shards, a term or epsilon "
                "added per rank)")
    micro = max(sd.micro_n) if sd.micro_n else 1
    if micro > 1 or sd.micro_1 > 1:
        return (f"the gradients differ by no common factor, and the step accumulated {sd.micro_1} micro-batch(es) "
                f"at world 1, {micro} per rank at world {n}: the loss is weighted per micro-batch or per rank (each "
                "micro-batch's or rank's mean over its own tokens or examples, divided by the number of "
                "micro-batches): divide the summed loss by the count over the whole window and all ranks "
                "(all-reduced), times the world size where DDP averages")
    views = (f" (the step's {sd.forwards_1} forwards fed one loss or saw the same examples: views of one batch, "
             "not micro-batches)" if sd.forwards_1 > 1 else "")
    return (f"the gradients differ by no common factor: the loss weighs examples differently at world {n}{views}: "
            "a mean or normaliser per rank (each rank divides by its own count of tokens, boxes, foreground "
            "examples...): divide the summed loss by the global count (all-reduced), times the world size "
            "where DDP averages")


def ranks_apart(key: str, r: int) -> str:
    """Why rank r's gradients ("grads") or weights after the step ("after") differ from rank 0's."""
    if key == "grads":
        return (f"rank {r}'s gradient differs from rank 0's as the optimizer steps: the gradients are not "
                "synchronised (no DDP, or an all_reduce missing for this parameter)")
    return (f"rank {r}'s weights part from rank 0's in this step although their gradients agree: the "
            "optimizer differs between ranks (a setting by rank, a step skipped on one rank?)")


def missing_in_optimizer(n: int, name: str) -> str:
    """World N's optimizer lacks a parameter world 1's steps."""
    return f"world {n}'s optimizer has no parameter {name}"


def unused_parameter(world: str) -> str:
    """A parameter with a gradient at one world size only (world: the one without, "1" or "N")."""
    return f"world {world} has no gradient for it: a parameter unused at one world size"


def traced(diagnosis: str, kind: str, at: int, drift: tuple) -> str:
    """A divergence of the trajectory (kind, at step `at`, its own cause `diagnosis`) named with the
    first step before it where something drifted (drift: step, what drifted, whether it is rounding,
    optimizer.UpdateWatch.drifts): a drift that is no rounding is where it starts; the signs of rounding
    (Adam's) moved some weights since, which may be what parts here, or not: said beside its own cause."""
    step, what, rounding = drift
    if rounding:
        return (f"{diagnosis}; earlier, at step {step}, {what}: the weights it moved (about 2 lr apart) may be what "
                "parts here if this cause does not fit")
    return (f"first drift at step {step}: {what}; it shows as this {kind} divergence at step {at} (which, read "
            f"alone, says: {diagnosis})")
