"""The confirm stage of check-script: a divergence of the trajectory that no factor of the world size
explains, computed again in float64.

    seconds = confirm_in_float64(judgement, rerun, batch_hint)   # may replace judgement.comparisons[i]

Which: a world N whose float32 comparison (plain, or mixed precision lifted) failed at a gradient, an
update or a weight, where world N's gradients at that step are no common multiple of world 1's other
than 1 (a factor of the world size is no rounding: it stands). Those worlds run again, with world 1's A
and B, their scripts computed in float64 (inrank/float64.py; run B's noise in float64's units), over
the same steps, and are compared as before (compare.py).

What it concludes (causes/rounding.py words it): world N agrees with world 1 in float64, and their
rerun reproduces itself: the float32 divergence was rounding, and the world is judged on the float64
comparison (a pass, with the float32 divergence said in its notes); world N parts in float64 too: the
float32 verdict stands, and the float64 divergence is said beside it; a float64 run that failed, or
world 1 in float64 not reproducing itself: not confirmed, the float32 verdict stands.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time

from mgpu.check.script.causes.rounding import float32_rounding, not_confirmed, not_rounding
from mgpu.check.script.inrank.precision import LOW
from mgpu.check.script.tensors import FACTOR_AGREE, common_factor

__all__ = ["confirm_in_float64", "CONFIRMED"]

# The divergences confirmed: those of the trajectory, which float32's rounding can make.
CONFIRMED = ("gradient", "update", "weight")


def _factor_of_world(run_n, run_a, step: int) -> bool:
    """World N's gradients at `step` are one common multiple of world 1's, other than 1."""
    try:
        got, ref = run_n.ranks[0].steps[step - 1].grads, run_a.ranks[0].steps[step - 1].grads
    except IndexError:
        return False
    c = common_factor(got, ref)
    return c is not None and abs(c - 1) > FACTOR_AGREE


def _wanted(run_n, comparison, world_1: dict) -> bool:
    first = comparison.first
    if comparison.status != "fail" or first is None or first.kind not in CONFIRMED or "A" not in world_1:
        return False
    float32 = run_n.lifted or (run_n.ranks[0].precision or {}).get("lowest", "float32") not in LOW
    return float32 and not (first.kind == "gradient" and _factor_of_world(run_n, world_1["A"], first.step))


def confirm_in_float64(judgement, rerun, batch_hint: str) -> float:
    """Each world N that `_wanted` picks, confirmed in float64 (the module docstring): its runs and world 1's
    run again by `rerun` (launch.run_world for the plan: rerun(planned, folder, float64=True)); the seconds it
    took (0.0 where none was picked: nothing runs)."""
    from mgpu.check.script.compare import compare_world, reproducibility
    from mgpu.check.script.plan import PlannedRun

    started = time.time()
    compared, by_kind = judgement.compared, judgement.references
    if len(compared) != len(judgement.comparisons) or judgement.unreproducible is not None:
        return 0.0
    picked = [(i, r) for i, (r, c) in enumerate(zip(compared, judgement.comparisons))
              if _wanted(r, c, by_kind.get((r.device, r.lifted), {}))]
    if not picked:
        return 0.0
    world_1: dict = {}
    with tempfile.TemporaryDirectory(prefix="mgpu-confirm-") as folder:
        for i, run_n in picked:
            c = judgement.comparisons[i]
            key = (run_n.device, run_n.lifted)
            if key not in world_1:
                world_1[key] = tuple(rerun(PlannedRun(1, run, run_n.device, run_n.lifted), folder, float64=True)
                                     for run in ("A", "B"))
            a, b = world_1[key]
            n = rerun(PlannedRun(run_n.world, "", run_n.device, run_n.lifted), folder, float64=True)
            # the float64 runs compared first, then worded (causes/rounding.py)
            failed = next((r for r in (a, b, n) if r.failure is not None), None)
            apart = failed is None and reproducibility(a, b) is not None
            wide = compare_world(n, a, b, judgement.facts, batch_hint) if failed is None and not apart else None
            if failed is not None:
                c.notes.append(not_confirmed(f"{failed.name} failed: {failed.failure.message}"))
            elif apart:
                c.notes.append(not_confirmed("world 1 computed in float64 does not reproduce itself"))
            elif wide.status == "pass":
                wide.notes.insert(0, float32_rounding(run_n.world, c.first, wide.steps))
                wide.precision = (c.precision + "; " if c.precision else "") + "confirmed in float64"
                judgement.comparisons[i] = dataclasses.replace(wide, compared=[f"{x} (float64)" for x in wide.compared])
            elif wide.first is not None:
                c.notes.append(not_rounding(run_n.world, wide.first))
    return time.time() - started
