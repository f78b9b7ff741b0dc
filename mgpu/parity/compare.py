"""How far apart two runs are, and whether that is rounding or a bug: tolerances from the computation.

A float32 run of a model never equals the exact result: its rounding error depends on the model,
the batch, the step and the tensor. So the tolerance is not a hand-picked atol. The same run in
float64 is the reference; the single-device float32 run's distance from it, tensor by tensor and
step by step, is the size of an honest float32 error; a data-parallel run passes when its own
distance from the float64 reference is at most `ERROR_FACTOR` times that (or, for a tensor the
single-device run happens to get almost exactly, `ERROR_FACTOR` times a floor of `FLOOR_ULPS`
float32 units in the last place of the tensor's largest element).
docs/design/check-tolerance.md says how the factor was measured.

Between replicas (or DDP ranks) of one run there is no rounding to allow for: they apply the same
gradients with the same arithmetic, so they must agree bitwise.

`assert_tensors_close` is the suite's comparison (correctness/ uses it): torch.testing's float32
defaults or bitwise, with a message naming where and what.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from mgpu.jsonsafe import finite_or_none

__all__ = ["ERROR_FACTOR", "FLOOR_ULPS", "Divergence", "error", "worst", "allowed_error", "compare_to_reference",
           "compare_bitwise", "assert_tensors_close", "max_abs_diff"]

# A data-parallel float32 run may be this many times further from the float64 reference than the
# single-device float32 run is (docs/design/check-tolerance.md: the worst ratio seen over the models
# measured was well under it; a real bug is off by orders of magnitude more).
ERROR_FACTOR = 16.0
# A tensor the single-device float32 run gets (almost) exactly still allows this many float32 ulps
# of its largest element, times ERROR_FACTOR.
FLOOR_ULPS = 4.0
_EPS32 = torch.finfo(torch.float32).eps


@dataclass
class Divergence:
    """Where two runs first part: the step, the tensor, the replica or rank, and by how much."""

    step: int | None          # 0 = the start, k = after step k; None for "after the last step" states
    tensor: str               # "weight fc.bias", "buffer bn.running_mean", "gradient conv.weight", ...
    replica: int | None       # replica or rank; None for figures of the whole run (loss, correct)
    max_abs: float            # largest absolute difference
    max_rel: float            # max_abs over the reference's largest magnitude
    allowed: float | None     # the largest max_abs allowed (0 for bitwise)
    against: str              # what it was compared with

    def describe(self, replica_word: str = "replica") -> str:
        where = [] if self.step is None else ["at the start" if self.step == 0 else f"after step {self.step}"]
        if self.replica is not None:
            where.append(f"on {replica_word} {self.replica}")
        allowed = "" if self.allowed is None else (
            " (bitwise equality required)" if self.allowed == 0 else f" (allowed {self.allowed:.2e})")
        return (f"{self.tensor} differs {' '.join(where)} from {self.against}: largest absolute error "
                f"{self.max_abs:.3e}, relative {self.max_rel:.3e}{allowed}")

    def to_json(self) -> dict:
        return finite_or_none(asdict(self))


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def error(actual: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """(largest absolute difference, that over the reference's largest magnitude)."""
    if actual.shape != reference.shape:
        return math.inf, math.inf
    if actual.numel() == 0:
        return 0.0, 0.0
    diff = max_abs_diff(actual, reference)
    if math.isnan(diff):
        return math.inf, math.inf
    scale = float(reference.double().abs().max())
    return diff, (diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))


def worst(pairs) -> dict:
    """The largest of (absolute, relative) error pairs, each on its own: {"max_abs", "max_rel"} (0.0 for none)."""
    out = {"max_abs": 0.0, "max_rel": 0.0}
    for abs_err, rel_err in pairs:
        out["max_abs"] = max(out["max_abs"], abs_err)
        out["max_rel"] = max(out["max_rel"], rel_err)
    return out


def allowed_error(single_error: float, reference: torch.Tensor) -> float:
    """The largest error a data-parallel float32 run may have on this tensor (see the module docstring)."""
    scale = float(reference.double().abs().max()) if reference.numel() else 0.0
    return ERROR_FACTOR * max(single_error, FLOOR_ULPS * _EPS32 * scale)


def compare_to_reference(actual: dict, reference: dict, single: dict, step: int | None, replica: int | None,
                         prefix: str = "", against: str = "the single-device float64 run") -> Divergence | None:
    """The first entry of `actual` (name -> tensor or None) farther from `reference` (float64)
    than `single` (the single-device float32 run) allows; None when every entry passes.

    Integer tensors (counters) must be equal. A missing gradient must be missing in both.
    """
    for name, ref in reference.items():
        label = f"{prefix}{name}"
        got = actual.get(name, "missing")
        if isinstance(got, str):
            return Divergence(step, label, replica, math.inf, math.inf, None, f"{against} (missing from this run)")
        if ref is None or got is None:
            if (ref is None) != (got is None):
                present = "no gradient" if got is None else "a gradient"
                return Divergence(step, label, replica, math.inf, math.inf, None,
                                  f"{against}, which has {'one' if got is None else 'none'} (this run has {present})")
            continue
        if not ref.is_floating_point():
            if not torch.equal(got.to(ref.dtype), ref):
                abs_err, rel_err = error(got.double(), ref.double())
                return Divergence(step, label, replica, abs_err, rel_err, 0.0, against)
            continue
        abs_err, rel_err = error(got, ref)
        single_ref = single.get(name)
        single_err = error(single_ref, ref)[0] if isinstance(single_ref, torch.Tensor) else 0.0
        allowed = allowed_error(single_err, ref)
        if not abs_err <= allowed:
            return Divergence(step, label, replica, abs_err, rel_err, allowed, against)
    return None


def compare_bitwise(actual: dict, expected: dict, step: int | None, replica: int | None, prefix: str = "",
                    against: str = "replica 0") -> Divergence | None:
    """The first entry of `actual` not bitwise equal to `expected`'s (NaN equal to NaN)."""
    for name, exp in expected.items():
        got = actual.get(name)
        label = f"{prefix}{name}"
        if exp is None or got is None:
            if (exp is None) != (got is None):
                return Divergence(step, label, replica, math.inf, math.inf, 0.0, f"{against} (one has no value)")
            continue
        if got.shape != exp.shape or got.dtype != exp.dtype or not torch.equal(
                torch.nan_to_num(got, nan=0.0) if got.is_floating_point() else got,
                torch.nan_to_num(exp, nan=0.0) if exp.is_floating_point() else exp):
            abs_err, rel_err = error(got.double(), exp.double()) if got.shape == exp.shape else (math.inf, math.inf)
            return Divergence(step, label, replica, abs_err, rel_err, 0.0, against)
    extra = sorted(set(actual) - set(expected))
    if extra:
        return Divergence(step, f"{prefix}{extra[0]}", replica, math.inf, math.inf, 0.0, f"{against} (which has no such entry)")
    return None


def assert_tensors_close(actual: dict, expected: dict, where: str, exact: bool = False) -> None:
    """assert_close on every entry (float32 defaults; bitwise when exact), the message naming
    `where` (device / rank / step) and the entry; assert_close adds how much and where inside."""
    assert actual.keys() == expected.keys(), f"{where}: entries differ: {sorted(actual.keys() ^ expected.keys())}"
    tol = dict(rtol=0.0, atol=0.0) if exact else {}
    for name, value in expected.items():
        torch.testing.assert_close(
            actual[name].cpu(), value.cpu(), **tol, equal_nan=exact,
            msg=lambda m, name=name: f"{where}: {name} differs ({'bitwise' if exact else 'float32 tolerance'}); {m}")
