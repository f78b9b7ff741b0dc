"""Causes of the collective family: torch.distributed's collectives called, in a training step, on a
tensor that requires grad (evidence: RankRecord.grad_collectives, recorded by inrank/collectives.py's
CollectiveWatch). What they return is a constant to autograd: the finding, and the cause of gradients
that part with no common factor (gradients.py)."""

from __future__ import annotations

from mgpu.check.script.inrank.collectives import WATCHED
from mgpu.check.script.inrank.records import CollectiveCall

__all__ = ["differentiable_fix", "collective_text", "collective_fix", "merged_collectives", "collective_finding",
           "collective_gradients"]


def differentiable_fix(op: str) -> str:
    """The differentiable call to use instead of torch.distributed's `op`."""
    return f"torch.distributed.nn.functional.{WATCHED.get(op, op)}"


def collective_text(calls) -> str:
    """'dist.all_gather at train.py:42 (4 call(s) in a run) on a tensor that requires grad', for each
    call site (CollectiveCall)."""
    return "; ".join(f"dist.{c.op} at {c.where} ({c.calls} call(s) in a run) on a tensor that requires grad"
                     for c in calls)


def collective_fix(calls) -> str:
    """'use torch.distributed.nn.functional.all_gather, which carries the gradient back'."""
    fixes = sorted({differentiable_fix(c.op) for c in calls})
    return f"use {' and '.join(fixes)}, which carr{'y' if len(fixes) > 1 else 'ies'} the gradient back"


def merged_collectives(records) -> tuple:
    """Every rank record's CollectiveCalls, one per (op, call site), with the most calls a run made."""
    most: dict = {}
    for r in records:
        for c in r.grad_collectives:
            most[(c.op, c.where)] = max(most.get((c.op, c.where), 0), c.calls)
    return tuple(CollectiveCall(op, where, n) for (op, where), n in most.items())


def collective_finding(calls) -> str:
    """The collective-without-autograd finding's text, for the merged calls (merged_collectives)."""
    return (f"{collective_text(calls)}: torch.distributed's collectives are not differentiable, what they "
            "return (or write in place) is a constant to autograd, so the gradient of the loss for the other ranks' "
            f"examples never comes back to this rank's parameters; {collective_fix(calls)}")


def collective_gradients(calls) -> str:
    """Why the gradients part with no common factor where the training step called such collectives."""
    return ("the gradients differ by no common factor, and the training step called "
            f"{collective_text(calls)} (finding collective-without-autograd): what "
            "torch.distributed's collectives return is a constant to autograd, so the gradient of the loss "
            f"for the other ranks' examples never comes back to this rank's: {collective_fix(calls)}")
