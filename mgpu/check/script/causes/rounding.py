"""Causes of the rounding family: what the float64 confirmation (confirm.py) says of a divergence of the
trajectory (a gradient, an update, a weight) that no factor of the world size explains. Evidence: the
same runs, world 1 (A and its rerun B) and world N, computed in float64 (inrank/float64.py)."""

from __future__ import annotations

__all__ = ["float32_rounding", "not_rounding", "not_confirmed"]


def _where(d) -> str:
    """A divergence of the trajectory in a few words: 'at step 7, gradient 0.bias (error 4.3e-07, allowed 2.4e-07)'."""
    size = f" (error {d.max_abs:.1e}, allowed {d.allowed:.1e})" if d.max_abs is not None and d.allowed else ""
    return f"{d.where()}, {d.kind} {d.tensor}{size}"


def float32_rounding(n: int, first, steps: int) -> str:
    """World N parted at float32 (`first`, its ScriptDivergence) and agrees in float64 over `steps`."""
    return (f"at float32 world {n} parted from world 1 {_where(first)}; computed in float64 (every model and every op "
            f"that meets one), world {n} computes what world 1 computes over {steps} optimizer step(s): float32's "
            "rounding carried further than world 1's rerun showed (an input within rounding of a ReLU's or a "
            "max-pool's kink goes the other way at another summation order, and the backward routes that "
            "element's gradient elsewhere; or a sum whose terms cancel), not the loop. Judged on the float64 "
            "comparison")


def not_rounding(n: int, first) -> str:
    """World N parts from world 1 in float64 too (`first`, its ScriptDivergence): the loop, not float32's rounding."""
    return (f"computed in float64 world {n} parts from world 1 too ({_where(first)}): not float32's rounding, which "
            "float64 takes away")


def not_confirmed(reason: str) -> str:
    """The float64 runs could not say (`reason`): the float32 verdict stands."""
    return f"not confirmed in float64: {reason}; the float32 verdict stands"
