"""`check`'s comparisons: a run's tensors against the float64 reference within the shared tolerance
(mgpu/check/tolerance.py, the spread being the single-device float32 step's own distance from the
float64 step; under --amp bf16 the bf16 step's), and between replicas bitwise.

The floor's epsilon is float32's, scaled by the float64 reference's largest element: the reference
is exact, the checked run is float32 (docs/design/check-tolerance.md).

Between replicas (or DDP ranks) of one run there is no rounding to allow for: they apply the same
gradients with the same arithmetic, so they must agree bitwise.

`assert_tensors_close` is the suite's comparison (correctness/ uses it): torch.testing's float32
defaults or bitwise, with a message naming where and what.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mgpu.check.divergence import Divergence
from mgpu.check.tolerance import allowed_error, bitwise_equal, error, largest

__all__ = ["ModelDivergence", "EPS32", "error", "worst", "reference_allowance", "compare_to_reference", "compare_bitwise",
           "assert_tensors_close"]

# The floor's epsilon: the checked runs are float32 (their bf16 parts round to float32 values too).
EPS32 = torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class ModelDivergence(Divergence):
    """A divergence `check` found: a run's tensor against the reference, or a replica against replica 0."""

    def describe(self, unit: str = "replica") -> str:
        """'weight fc.bias differs after step 2 on replica 1 from replica 0: largest absolute error ...'."""
        where = [] if self.step is None else ["at the start" if self.step == 0 else f"after step {self.step}"]
        if self.rank is not None:
            where.append(f"on {unit} {self.rank}")
        allowed = "" if self.allowed is None else (
            " (bitwise equality required)" if self.allowed == 0 else f" (allowed {self.allowed:.2e})")
        return (f"{self.tensor} differs {' '.join(where)} from {self.against}: largest absolute error "
                f"{self.max_abs:.3e}, relative {self.max_rel:.3e}{allowed}")


def worst(pairs) -> dict:
    """The largest of (absolute, relative) error pairs, each on its own: {"max_abs", "max_rel"} (0.0 for none)."""
    out = {"max_abs": 0.0, "max_rel": 0.0}
    for abs_err, rel_err in pairs:
        out["max_abs"] = max(out["max_abs"], abs_err)
        out["max_rel"] = max(out["max_rel"], rel_err)
    return out


def reference_allowance(single_error: float, reference: torch.Tensor) -> float:
    """The shared rule with check's spread (the single-device float32 step's error) and floor
    (float32 ulps of the float64 reference's largest element)."""
    return allowed_error(single_error, largest(reference), EPS32)


def compare_to_reference(actual: dict, reference: dict, single: dict, step: int | None, replica: int | None,
                         prefix: str = "", against: str = "the single-device float64 run") -> ModelDivergence | None:
    """The first entry of `actual` (name -> tensor or None) farther from `reference` (float64)
    than `single` (the single-device float32 run) allows; None when every entry passes.

    Integer tensors (counters) must be equal. A missing gradient must be missing in both.
    """
    for name, ref in reference.items():
        label = f"{prefix}{name}"
        got = actual.get(name, "missing")
        if isinstance(got, str):
            return ModelDivergence(step, tensor=label, rank=replica, max_abs=math.inf, max_rel=math.inf,
                              against=f"{against} (missing from this run)")
        if ref is None or got is None:
            if (ref is None) != (got is None):
                present = "no gradient" if got is None else "a gradient"
                return ModelDivergence(step, tensor=label, rank=replica, max_abs=math.inf, max_rel=math.inf,
                                  against=f"{against}, which has {'one' if got is None else 'none'} (this run has {present})")
            continue
        if not ref.is_floating_point():
            if not torch.equal(got.to(ref.dtype), ref):
                abs_err, rel_err = error(got.double(), ref.double())
                return ModelDivergence(step, tensor=label, rank=replica, max_abs=abs_err, max_rel=rel_err, allowed=0.0,
                                  against=against)
            continue
        abs_err, rel_err = error(got, ref)
        single_ref = single.get(name)
        single_err = error(single_ref, ref)[0] if isinstance(single_ref, torch.Tensor) else 0.0
        allowed = reference_allowance(single_err, ref)
        if not abs_err <= allowed:
            return ModelDivergence(step, tensor=label, rank=replica, max_abs=abs_err, max_rel=rel_err, allowed=allowed,
                              against=against)
    return None


def compare_bitwise(actual: dict, expected: dict, step: int | None, replica: int | None, prefix: str = "",
                    against: str = "replica 0") -> ModelDivergence | None:
    """The first entry of `actual` not bitwise equal to `expected`'s (NaN equal to NaN)."""
    for name, exp in expected.items():
        got = actual.get(name)
        label = f"{prefix}{name}"
        if exp is None or got is None:
            if (exp is None) != (got is None):
                return ModelDivergence(step, tensor=label, rank=replica, max_abs=math.inf, max_rel=math.inf, allowed=0.0,
                                  against=f"{against} (one has no value)")
            continue
        if not bitwise_equal(got, exp):
            abs_err, rel_err = error(got.double(), exp.double()) if got.shape == exp.shape else (math.inf, math.inf)
            return ModelDivergence(step, tensor=label, rank=replica, max_abs=abs_err, max_rel=rel_err, allowed=0.0,
                              against=against)
    extra = sorted(set(actual) - set(expected))
    if extra:
        return ModelDivergence(step, tensor=f"{prefix}{extra[0]}", rank=replica, max_abs=math.inf, max_rel=math.inf,
                          allowed=0.0, against=f"{against} (which has no such entry)")
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
