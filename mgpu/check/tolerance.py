"""How far apart two runs may be: one rule for `check` and `check-script`, and one error function.

A floating-point run never equals the exact result, so the tolerance is no hand-picked atol. Each
check measures how far an *honest* difference carries in this computation, tensor by tensor and
step by step (the spread), and allows

    allowed = FACTOR * max(spread, FLOOR_ULPS * eps * scale)

where each source supplies eps, scale and the spread. The floor covers a tensor the spread happens
to get almost exactly.

* `check` (mgpu/check/model): the spread is the single-device float32 (or bf16) step's distance from the
  float64 step, eps float32's, the scale the float64 reference's largest element;
  docs/design/check-tolerance.md says how the factor was measured;
* `check-script` (mgpu/check/script): the spread is world 1's rerun, whose gradients are moved by a
  rounding-sized perturbation, against world 1's plain run; eps the tensor's dtype's, the scale the
  largest element of the tensor's module (docs/guide/check-script.md).

A real bug is off by orders of magnitude more than FACTOR times rounding.
"""

from __future__ import annotations

import math
import weakref

import torch

__all__ = ["FACTOR", "FLOOR_ULPS", "error", "allowed_error", "largest", "eps_of", "bitwise_equal"]

# A data-parallel run may be this many times further from the reference than the spread.
FACTOR = 16.0
# A tensor the spread gets (almost) exactly still allows this many units in the last place of its scale.
FLOOR_ULPS = 4.0


def eps_of(t: torch.Tensor) -> float:
    """Machine epsilon of a floating tensor's dtype (0 for integers: they must be equal)."""
    return torch.finfo(t.dtype).eps if t.is_floating_point() else 0.0


def _working(t: torch.Tensor) -> torch.Tensor:
    """t in a dtype whose differences are exact enough to judge by: its own from float32 up (a
    difference of two float32s is zero exactly when they are equal), float32 below (bf16, fp16)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


# largest() of each tensor, remembered while the tensor lives and is not changed in place (its
# _version): a comparison asks it of one recorded tensor for the floor, the pool, the module's scale
# and the sensitivity.
# id(tensor) -> (a weak reference to it, its _version, the value); an entry leaves with its tensor.
_LARGEST: dict[int, tuple] = {}


def largest(t) -> float:
    """The largest magnitude of a floating tensor (NaN read as 0, infinity kept); 0.0 for anything else."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return 0.0
    known = _LARGEST.get(id(t))
    if known is not None and known[0]() is t and known[1] == t._version:
        return known[2]
    # One pass without a copy (the infinity norm); NaN, rare, takes the slow path that reads it as 0.
    value = float(torch.linalg.vector_norm(_working(t), ord=math.inf))
    if math.isnan(value):
        value = float(t.double().abs().nan_to_num(nan=0.0, posinf=math.inf).max())
    key = id(t)
    try:
        _LARGEST[key] = (weakref.ref(t, lambda _ref, key=key: _LARGEST.pop(key, None)), t._version, value)
    except TypeError:  # a tensor subclass that cannot be referenced weakly: not remembered
        pass
    return value


def error(actual: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(largest absolute difference, that over the reference's largest magnitude). NaN where both
    hold NaN counts as equal; any other NaN, or another shape, is infinitely far."""
    if actual.shape != reference.shape:
        return math.inf, math.inf
    if actual.numel() == 0:
        return 0.0, 0.0
    # The common case in one subtraction and two norms, in the tensors' own precision (float32 and up):
    # check-script compares every gradient and weight of a model each step, 10^7 elements a tensor.
    a, b = _working(actual), _working(reference)
    if a.dtype != b.dtype:
        a, b = a.double(), b.double()
    diff = float(torch.linalg.vector_norm(a - b, ord=math.inf))
    if math.isnan(diff):  # a NaN somewhere: equal where both hold one, else infinitely far
        a, b = a.double(), b.double()
        d = torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(a), (a - b).abs())
        diff = float(d.max())
        if math.isnan(diff):
            return math.inf, math.inf
    scale = largest(reference)
    return diff, (diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))


def allowed_error(spread: float, scale: float, eps: float) -> float:
    """FACTOR * max(spread, FLOOR_ULPS * eps * scale): the rule of the module docstring. A spread
    that is not finite (the spread's own run went wrong) counts as none."""
    spread = spread if math.isfinite(spread) else 0.0
    return FACTOR * max(spread, FLOOR_ULPS * eps * scale)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same shape, dtype and bits, NaN equal to NaN: what two computations with the same arithmetic
    (the replicas of a run, a run and its rerun) must hold, with no rounding to allow for."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):  # one pass, no copy: the common case
        return True
    if not a.is_floating_point():
        return False
    # torch.equal is False wherever both hold NaN (rare: copies then); NaN against a number stays unequal.
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return torch.equal(nan_a, nan_b) and torch.equal(a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0))
