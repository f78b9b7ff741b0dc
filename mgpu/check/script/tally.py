"""What one world's comparison measured, kind by kind ("gradient", "update", "weight", ...).

    tally = Tally()
    tally.add("gradient", "fc1.weight", step=1, error=3e-8, allowed=1.2e-6, scale=0.4)
    tally.sensitivity["gradient"]["relative"]   # 3e-06: the smallest relative difference it would call

* **worst**: the tensor that came closest to its tolerance (largest error / allowed);
* **sensitivity**: the smallest relative difference of that kind the comparison would have called, the
  least `allowed / scale` over every (step, tensor) compared, with scale the reference's largest
  magnitude. A difference of `delta * |reference|` in every tensor of the kind fails where
  `delta > sensitivity` by a margin (twice is called) and passes where it is well below (half passes):
  what a PASSED proves;
* **compared**: how many (step, tensor) pairs of each kind were compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Tally"]


@dataclass
class Tally:
    worst: dict = field(default_factory=dict)        # kind -> {"tensor", "step", "error", "allowed", "ratio"}
    sensitivity: dict = field(default_factory=dict)  # kind -> {"relative", "tensor", "step"}
    compared: dict = field(default_factory=dict)     # kind -> (step, tensor) pairs compared

    def add(self, kind: str, tensor: str, step: int, error: float, allowed: float, scale: float) -> None:
        """One tensor compared: its error against world 1, its allowed error, the reference's largest magnitude."""
        self.compared[kind] = self.compared.get(kind, 0) + 1
        if scale > 0 and math.isfinite(scale) and math.isfinite(allowed):
            relative = allowed / scale
            cur = self.sensitivity.get(kind)
            if cur is None or relative < cur["relative"]:
                self.sensitivity[kind] = {"relative": relative, "tensor": tensor, "step": step}
        if not math.isfinite(error):
            return
        ratio = error / allowed if allowed > 0 else (0.0 if error == 0 else math.inf)
        cur = self.worst.get(kind)
        if cur is None or ratio > cur["ratio"]:
            self.worst[kind] = {"tensor": tensor, "step": step, "error": error, "allowed": allowed, "ratio": ratio}

    def sensitivity_line(self) -> str:
        """'gradients 3.1e-06, weights 2.4e-05 (relative)', or '' when nothing was compared."""
        words = {"gradient": "gradients", "update": "updates", "weight": "weights"}
        parts = [f"{words.get(k, k)} {v['relative']:.1e}" for k, v in sorted(self.sensitivity.items())]
        return ", ".join(parts) + " (relative)" if parts else ""

    def to_json(self) -> dict:
        return {"worst": self.worst, "sensitivity": self.sensitivity, "compared": self.compared}
