"""Where two runs first part: a `Divergence`, one class for `check` and `check-script` (what a check
notices that is not a divergence is a Finding: mgpu/check/findings.py).

    ScriptDivergence(step=1, kind="gradient", tensor="fc1.weight", rank=0, max_abs=3e-4, max_rel=2e-3,
               allowed=1e-6, diagnosis="every gradient is 0.500 x world 1's = 1/N: ...")
    ModelDivergence(step=2, tensor="weight fc.bias", rank=1, max_abs=1e-3, max_rel=1e-2, allowed=0.0,
               against="replica 0")

Every field is a keyword: a divergence names what it knows and leaves the rest at its default. Each
check says it in its own words: `check` builds a ModelDivergence (mgpu/check/model/compare.py),
`check-script` a ScriptDivergence (mgpu/check/script/divergence.py); both are Divergences.
"""

from __future__ import annotations

import abc
from dataclasses import KW_ONLY, dataclass

from mgpu.jsonsafe import finite_or_none

__all__ = ["Divergence"]


@dataclass(frozen=True)
class Divergence(abc.ABC):
    """Where two runs first part: the step, the tensor, the rank (or replica), by how much, and why."""

    step: int | None              # 0 = before step 1 (the start), k = at or after step k; None: the whole run
    _: KW_ONLY                    # the rest by name: Divergence(1, kind="gradient", tensor="fc.weight", ...)
    tensor: str | None = None     # "fc1.weight", "weight fc.bias", "inputs of Net"
    kind: str = ""                # check-script's (ScriptDivergence.KINDS); check leaves it empty
    rank: int | None = None       # the rank or replica that differs; None for figures of the whole run
    max_abs: float | None = None  # largest absolute difference
    max_rel: float | None = None  # max_abs over the reference's largest magnitude
    allowed: float | None = None  # the largest max_abs allowed (0: bitwise equality required)
    against: str = ""             # what it was compared with ("the single-device float64 run")
    diagnosis: str = ""           # the cause the evidence points to
    detail: str = ""              # what was seen, where a number does not say it ("12 of 16 examples ...")

    @property
    def replica(self) -> int | None:
        """The rank under `check`'s word for it (a replica of nn.DataParallel or the manual strategy)."""
        return self.rank

    @abc.abstractmethod
    def describe(self, unit: str = "replica") -> str:
        """One line in the words of the check that found it: ModelDivergence and ScriptDivergence say it
        (a Divergence itself cannot be made: it has no words of its own)."""

    def to_json(self) -> dict:
        """Every field (non-finite floats as null), and `replica` beside `rank` (check's reports named it so)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["replica"] = self.rank
        return finite_or_none(out)
