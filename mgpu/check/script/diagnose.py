"""Why world N parts from world 1: the cause a divergence's evidence supports (a common factor
between the gradients or the updates, micro-batches, a normaliser per rank, randomness, a collective
without autograd, no process group, uninitialised memory), and the facts about the script that the
judge learned from every rank's record (ScriptFacts). Each cause is a rule with the evidence it
needs (docs/guide/check-script.md, "Causes and the evidence they need").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mgpu.check.script.inrank.records import CollectiveCall
from mgpu.check.script.inrank.collectives import differentiable_fix
from mgpu.check.script.data import StepData
from mgpu.check.script.tensors import FACTOR_AGREE, common_factor, name_factor

__all__ = ["ScriptFacts", "other_start", "gradient_diagnosis", "update_diagnosis", "explained", "collective_text", "collective_fix",
           "merged_collectives", "uninitialised_cause", "no_process_group", "UNINITIALISED"]

# The start of the reproducibility cause for weights that hold uninitialised memory (report.py says no "seed it").
UNINITIALISED = "uninitialised memory"


@dataclass(frozen=True)
class ScriptFacts:
    """What the judge learned of the script from every rank's record that explains a divergence."""

    batchnorm: tuple = ()        # BatchNorm modules normalising per rank (synchronised by the check at world N)
    random_draws: dict = field(default_factory=dict)   # torch function -> draws inside a forward, beyond dropout
    collectives: tuple = ()      # CollectiveCall: a collective without autograd on a tensor that requires grad
    randomness: dict = field(default_factory=dict)     # the script's draws outside the forward (augment.randomness_facts)


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
    if facts.collectives:
        return ("the gradients differ by no common factor, and the training step called "
                f"{collective_text(facts.collectives)} (finding collective-without-autograd): what "
                "torch.distributed's collectives return is a constant to autograd, so the gradient of the loss "
                f"for the other ranks' examples never comes back to this rank's: {collective_fix(facts.collectives)}")
    extra = explained(facts)
    if extra:
        return extra
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


def explained(facts: ScriptFacts) -> str:
    """A known reason for world N to differ, from the findings: randomness in the forward. (BatchNorm
    is no reason: the check synchronises it over the ranks at world N, batchnorm.SyncedBatchNorm.)"""
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


def update_diagnosis(got: dict, ref: dict, n: int, facts: ScriptFacts, rounding: str = "") -> str:
    """Why the updates (weights after - before, name -> tensor) part although the gradients and every
    param_groups setting agree (compare.py compares both first). `rounding`: what of the difference is
    a normalising optimizer's sign of rounding-level gradients (optimizer.py), said but never blamed."""
    c = common_factor(got, ref)
    if c is not None and abs(c - 1) > FACTOR_AGREE:
        name = name_factor(c, n)
        return (f"every update is {c:.3f} x world 1's" + (f" = {name}" if name else "") + ", although the gradients "
                "and every param_groups setting (lr, weight decay, betas, momentum...) agree: a step size kept "
                "outside param_groups changes with the world size (an optimizer's own scale or learning-rate "
                "attribute, a wrapper that scales the step)")
    return explained(facts) or ((rounding + "; beyond those, ") if rounding else "") + (
        "the gradients and every param_groups setting agree, but the update does not: the optimizer's state "
        "(loaded or built otherwise at this world size) or a step size kept outside param_groups depends on "
        "the world size")


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


def schedule_cause(got: list, ref: list, n: int, base_agrees: bool = True) -> str:
    """Why the learning rate differs where its schedule's base agrees, from the schedulers recorded at
    the step (feeds.FeedWatch: type, scheduler steps made, length, the module that stepped them), world
    N's against world 1's; '' where none were recorded or they pair up otherwise. Pace is the fraction
    of its length a scheduler has made: steps / length (steps alone where it has no length). Another
    pace: stepped more often, or a length counted otherwise. The same pace over k times the steps and
    k times the length: another schedule, not a faster one (OneCycleLR's phases end at
    pct_start * total_steps - 1: that - 1 does not scale with the length). base_agrees=False: said of
    what remains of a learning rate's ratio beyond its base's (optimizer.setting_diagnosis), whose base
    differs."""
    agrees = " (its base learning rate agrees)" if base_agrees else ""
    if not got or len(got) != len(ref) or any(a["type"] != b["type"] for a, b in zip(got, ref)):
        return ""
    apart = next(((a, b) for a, b in zip(got, ref) if (a["steps"], a["length"]) != (b["steps"], b["length"])), None)
    types = " and ".join(sorted({a["type"] for a in got}))
    if apart is None:
        return (f"the schedule is computed otherwise at this world size: its scheduler ({types}) made as many steps "
                "over the same length at both world sizes, so its function or settings depend on the world size (a "
                "LambdaLR of the world size, a warmup counted per rank?)")
    a, b = apart
    if not a["steps"] or not b["steps"]:
        return ""
    facts = (f"{a['type']} had made {a['steps']} scheduler step(s)" + _over(a) + f" at world {n}, {b['steps']}" +
             _over(b) + " at world 1")
    often = a["steps"] / b["steps"]
    longer = a["length"] / b["length"] if a["length"] and b["length"] else 1.0
    by_accelerate = a["by"].startswith("accelerate")
    if a["steps"] * (b["length"] or 1) == b["steps"] * (a["length"] or 1):
        why = ("OneCycleLR ends its phases at pct_start * total_steps - 1 scheduler steps, and that - 1 (one "
               f"scheduler step) does not scale with total_steps: its phases end at other optimizer steps at world {n}"
               if a["type"] == "OneCycleLR" else f"{a['type']} does not compute the same curve over {often:g} times "
               "the steps (phase ends, milestones or warmups in whole scheduler steps, or its recursive arithmetic)")
        return (f"the learning-rate schedule is another one at this world size, at the same pace{agrees}: {facts}: "
                f"{often:g} times the steps over {longer:g} times the length: {why}: count the "
                "schedule's length in optimizer steps and step it once per optimizer step, the same at every world "
                "size" + (" (accelerate steps a prepared scheduler num_processes times per optimizer step: pass "
                          "Accelerator(step_scheduler_with_optimizer=False) and take the length from the prepared "
                          "DataLoader, len(train_dataloader) after accelerator.prepare)" if by_accelerate else ""))
    pace = often / longer
    causes = []
    if often != 1:
        causes.append(f"a scheduler stepped {often:g} times as often" + (
            " (accelerate steps a prepared scheduler num_processes times per optimizer step unless "
            "step_scheduler_with_optimizer=False: pass Accelerator(step_scheduler_with_optimizer=False) and count "
            "the length in optimizer steps)" if by_accelerate else " (once per process or per micro-batch)"))
    if longer != 1:
        causes.append(f"a schedule length {longer:g} x world 1's (counted per rank or per process): count it in "
                      "optimizer steps, the same at every world size")
    return (f"the learning-rate schedule runs at another pace at this world size{agrees}: "
            f"{facts}: {pace:.4g} x world 1's pace: " + "; and ".join(causes))


def _over(s: dict) -> str:
    return f" of {s['length']:g}" if s["length"] else ""
