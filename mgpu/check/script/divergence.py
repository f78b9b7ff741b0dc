"""check-script's divergence: its kinds, and the one line it says about each.

    at step 1, gradient fc1.weight: error 3.000e-04 against world 1 (allowed 1.000e-06; relative 2.000e-03): cause
    at step 2, optimizer setting lr of param group 0: world 2 2e-06, world 1 1e-06: cause
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mgpu.check.divergence import Divergence

__all__ = ["ScriptDivergence"]

_LABELS = {"gradient": "gradient", "update": "update", "weight": "weight after the step", "start": "weight"}


@dataclass(frozen=True)
class ScriptDivergence(Divergence):
    """A divergence check-script found: world N against world 1 (or a rank against rank 0), of a kind."""

    KINDS = ("start", "ranks", "data", "setting", "gradient", "update", "weight")

    def where(self) -> str:
        return "before step 1" if self.step == 0 else f"at step {self.step}"

    def describe(self, unit: str = "rank") -> str:
        """'at step 1, gradient fc1.weight: error ... against world 1 (allowed ...; relative ...): cause'."""
        if self.kind == "data":
            what = f"{self.where()}, {self.detail}"
        elif self.kind == "setting":  # "at step 2, optimizer setting lr of param group 0: world 2 2e-06, world 1 1e-06"
            what = f"{self.where()}, optimizer setting {self.tensor}: {self.detail}"
        elif self.kind == "ranks":
            what = f"{self.where()}, {self.tensor} on rank {self.rank} differs from rank 0's"
            if self.max_abs is not None:
                what += f" (largest difference {self.max_abs:.3e}; bitwise equality required)"
        else:
            what = (f"{self.where()}, {_LABELS[self.kind]} {self.tensor}: error {_num(self.max_abs)} against "
                    f"world 1 (allowed {_num(self.allowed)}; relative {_num(self.max_rel)})")
        return f"{what}: {self.diagnosis}"


def _num(x) -> str:
    return "n/a" if x is None else ("inf" if x == math.inf else f"{x:.3e}")
