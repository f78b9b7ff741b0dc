"""What check-script reports of a world: its first divergence from world 1 (`Divergence`) and the
comparison's outcome (`WorldComparison`), shared by the comparison (compare.py, data.py) and the
report (report.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Divergence", "WorldComparison"]


@dataclass
class Divergence:
    step: int                  # 0: before step 1
    kind: str                  # "start", "ranks", "data", "gradient", "weight"
    tensor: str                # "fc1.weight", "inputs of Net"
    rank: int | None
    max_abs: float | None
    allowed: float | None
    max_rel: float | None
    diagnosis: str
    detail: str = ""           # "12 of 16 examples ..." for data

    def where(self) -> str:
        return "before step 1" if self.step == 0 else f"at step {self.step}"

    def describe(self, world: int) -> str:
        """'at step 1, gradient fc1.weight: error ... (allowed ...): diagnosis'."""
        if self.kind == "data":
            what = f"{self.where()}, {self.detail}"
        elif self.kind == "ranks":
            what = f"{self.where()}, {self.tensor} on rank {self.rank} differs from rank 0's"
            if self.max_abs is not None:
                what += f" (largest difference {self.max_abs:.3e}; bitwise equality required)"
        else:
            label = {"gradient": "gradient", "weight": "weight after the step", "start": "weight"}[self.kind]
            what = (f"{self.where()}, {label} {self.tensor}: error {_num(self.max_abs)} against world 1 "
                    f"(allowed {_num(self.allowed)}; relative {_num(self.max_rel)})")
        return f"{what}: {self.diagnosis}"

    def to_json(self) -> dict:
        out = dict(self.__dict__)
        for k in ("max_abs", "allowed", "max_rel"):
            if isinstance(out[k], float) and not math.isfinite(out[k]):
                out[k] = None
        return out


def _num(x) -> str:
    return "n/a" if x is None else ("inf" if x == math.inf else f"{x:.3e}")


@dataclass
class WorldComparison:
    world: int
    status: str                # "pass", "fail", "finding", "not-compared"
    steps: int                 # steps compared
    first: Divergence | None = None
    worst: dict = field(default_factory=dict)    # kind -> {"tensor", "step", "error", "allowed"}: largest error/allowed
    notes: list = field(default_factory=list)
    reason: str = ""

    def to_json(self) -> dict:
        return {"world": self.world, "status": self.status, "steps_compared": self.steps,
                "first_divergence": self.first.to_json() if self.first else None, "worst": self.worst,
                "notes": self.notes, "reason": self.reason}
