"""Causes of the optimizer family: settings (param_groups) that differ from world 1's or between ranks,
a learning-rate schedule at another pace or another schedule, an update that parts while the gradients
and settings agree, and a normalising optimizer's signs of rounding. Evidence: every param_groups
setting at each step (inrank/settings.py), the schedulers recorded at the step (inrank/feeds.py), the
weights around the step (optimizer.UpdateWatch)."""

from __future__ import annotations

import math

from mgpu.check.script.causes.randomness import explained
from mgpu.check.script.tensors import (ABSENT, FACTOR_AGREE, common_factor, name_factor, same_setting, schedule_key,
                                       setting_ratio)

__all__ = ["setting_diagnosis", "schedule_cause", "regrouped", "set_by_rank", "schedule_drift", "schedule_unreached",
           "update_diagnosis", "rounding_signs", "update_drift", "sign_drift"]

_SCALED = {"N": "a learning rate scaled by the world size (linear scaling rule)",
           "sqrt(N)": "a learning rate scaled by the square root of the world size (square-root scaling rule)",
           "1/N": "a learning rate divided by the world size", "1/sqrt(N)": "a learning rate divided by the square "
           "root of the world size"}
_KEEP = ("; the global batch is the same at every world size, so the learning rate must be too: scale it with the "
         "global batch, never with the number of ranks")
_PACE = ("the learning-rate schedule runs at another pace at this world size (its base learning rate agrees): a "
         "scheduler stepped once per process or per micro-batch (accelerate steps a prepared scheduler "
         "num_processes times per optimizer step unless step_scheduler_with_optimizer=False), or a schedule whose "
         "length is counted per rank")


# -- settings ----------------------------------------------------------------------------------------------

def regrouped() -> str:
    """World N's optimizer has another number of param groups."""
    return "the parameters are grouped otherwise at this world size"


def set_by_rank(r: int, shown: tuple[str, str]) -> str:
    """Rank r's setting (shown: rank r's value, rank 0's, as text) differs from rank 0's."""
    return (f"rank {r} uses {shown[0]}, rank 0 {shown[1]}: the optimizer is set by rank (a setting or schedule "
            "computed from the rank, a scheduler stepped on some ranks only?)")


def setting_diagnosis(key: str, groups: tuple[dict, dict], n: int, agreed: bool,
                      schedulers: tuple = ((), ())) -> str:
    """Why a setting differs (groups: world N's param group, world 1's): a learning rate scaled by a
    power of N (its base, a scheduler's initial_lr, too), a schedule at another pace or another schedule
    (its base agrees, or it agreed before: the schedulers recorded at the step tell which,
    schedule_cause), another setting by N."""
    got, ref = groups
    a, b = got.get(key, ABSENT), ref.get(key, ABSENT)
    if ABSENT in (a, b):
        return (f"the optimizer is built with other options at this world size: {key} is set at world "
                f"{n if b == ABSENT else 1} only")
    c = setting_ratio(a, b)
    name = name_factor(c, n) if c is not None else None
    factor = "" if c is None else f"{c:.4g} x world 1's" + (f" = {name}" if name else "") + ": "
    if key in ("initial_lr", "max_lr", "min_lr", "base_lr"):
        return factor + f"the schedule's base learning rate ({key}): " + (
            _SCALED[name] + _KEEP if name else "set from the world size or the rank") + (
            "; the learning rate the step uses agrees until the schedule leaves zero (a warmup)")
    if key != "lr":
        what = "the schedule's" if schedule_key(key) else "optimizer setting"
        return factor + f"{what} {key} " + ("is set from the world size" if name else
                                            "depends on the world size (or the rank)")
    base = setting_ratio(got.get("initial_lr"), ref.get("initial_lr"))
    if base is not None and same_setting(got["initial_lr"], ref["initial_lr"]):
        return factor + (schedule_cause(*schedulers, n) or _PACE)
    if base is not None:
        base_name = name_factor(base, n)
        return factor + (_SCALED[base_name] if base_name else "a learning rate set from the world size or the "
                         "rank") + f" (its schedule's base, initial_lr, is {base:.4g} x world 1's)" + _KEEP + \
            _beyond_base(c, base, n, schedulers)
    if agreed:
        return factor + (schedule_cause(*schedulers, n) or _PACE)
    return factor + (_SCALED[name] + _KEEP if name else "the learning rate depends on the world size (or the rank)")


def _beyond_base(c: float | None, base: float, n: int, schedulers: tuple) -> str:
    """What of the learning rate's ratio to world 1's its base's ratio does not explain (lr 4 x world 1's
    over an initial_lr 2 x: a learning rate scaled by N and, besides, a warmup that accelerate's prepared
    scheduler steps N times an optimizer step): the schedule's own part, from the schedulers recorded at
    the step; '' where the base explains it all (the same float64 arithmetic: equal up to rounding)."""
    if c is None or math.isclose(c, base, rel_tol=1e-9):
        return ""
    return (f"; and beyond its base, the learning rate is {c / base:.4g} x more: " +
            (schedule_cause(*schedulers, n, base_agrees=False) or
             _PACE.replace(" (its base learning rate agrees)", "")))


def schedule_drift(diagnosis: str, step: int, tensor: str, detail: str) -> str:
    """A setting's cause (`diagnosis`) named with the first step where its schedule's base differed
    (tensor, detail: that divergence's)."""
    return f"{diagnosis}; first drift at step {step}: the schedule's {tensor}: {detail}"


def schedule_unreached(diagnosis: str) -> str:
    """A schedule's base that differed while the step's own settings never did, in the steps compared."""
    return diagnosis + " (it never reached the step's own learning rate in the steps compared)"


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


# -- updates -----------------------------------------------------------------------------------------------

def update_diagnosis(got: dict, ref: dict, n: int, facts, rounding: str = "") -> str:
    """Why the updates (weights after - before, name -> tensor) part although the gradients and every
    param_groups setting agree (compare.py compares both first). `rounding`: what of the difference is
    a normalising optimizer's sign of rounding-level gradients (rounding_signs), said but never blamed."""
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


def rounding_signs(flipped: int, differ: int, optimizer_type: str) -> str:
    """Of the `differ` elements of an update that differ, `flipped` have a gradient at rounding level."""
    return (f"{flipped} of the {differ} element(s) that differ have a gradient at rounding level ({optimizer_type} "
            "turns those into lr*sign(g): rounding, not a bug)")


def update_drift(c: float) -> str:
    """A drift: every update c x world 1's, inside the tolerance."""
    return f"every update is {c:.3f} x world 1's, inside the tolerance"


def sign_drift(optimizer_type: str, name: str, count: int) -> str:
    """A drift: a normalising optimizer's update took the other sign where the gradient is at rounding level."""
    return (f"{optimizer_type}'s update of {name} took the other sign in {count} element(s) whose gradient is at "
            "rounding level (lr*sign(g) of rounding, not a bug)")
