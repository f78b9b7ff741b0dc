"""What a check finds: where two runs first part (`Divergence`) and what it notices about the model
or the script that is not a divergence (`Finding`). One class each, for `check` and `check-script`.

    Divergence(step=1, kind="gradient", tensor="fc1.weight", rank=0, max_abs=3e-4, max_rel=2e-3,
               allowed=1e-6, diagnosis="every gradient is 0.500 x world 1's = 1/N: ...")
    Divergence(step=2, tensor="weight fc.bias", rank=1, max_abs=1e-3, max_rel=1e-2, allowed=0.0,
               against="replica 0")

Every field is a keyword: a divergence names what it knows and leaves the rest at its default.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field

from mgpu.jsonsafe import finite_or_none

__all__ = ["Divergence", "Finding"]

# check-script's kinds of divergence, as its reports name them; `check` leaves `kind` empty and
# names the tensor in full ("gradient fc.weight", "buffer bn.running_mean").
KINDS = ("start", "ranks", "data", "setting", "gradient", "update", "weight")
_SCRIPT_LABELS = {"gradient": "gradient", "update": "update", "weight": "weight after the step", "start": "weight"}


@dataclass(frozen=True)
class Divergence:
    """Where two runs first part: the step, the tensor, the rank (or replica), by how much, and why."""

    step: int | None              # 0 = before step 1 (the start), k = at or after step k; None: the whole run
    _: KW_ONLY                    # the rest by name: Divergence(1, kind="gradient", tensor="fc.weight", ...)
    tensor: str | None = None     # "fc1.weight", "weight fc.bias", "inputs of Net"
    kind: str = ""                # check-script's: start | ranks | data | setting | gradient | update | weight
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

    def where(self) -> str:
        return "before step 1" if self.step == 0 else f"at step {self.step}"

    def describe(self, unit: str = "replica") -> str:
        """One line: check-script's 'at step 1, gradient fc1.weight: error ... (allowed ...): cause', or
        check's 'weight fc.bias differs after step 2 on replica 1 from replica 0: largest ...'."""
        return self._describe_script() if self.kind else self._describe_check(unit)

    def _describe_check(self, unit: str) -> str:
        where = [] if self.step is None else ["at the start" if self.step == 0 else f"after step {self.step}"]
        if self.rank is not None:
            where.append(f"on {unit} {self.rank}")
        allowed = "" if self.allowed is None else (
            " (bitwise equality required)" if self.allowed == 0 else f" (allowed {self.allowed:.2e})")
        return (f"{self.tensor} differs {' '.join(where)} from {self.against}: largest absolute error "
                f"{self.max_abs:.3e}, relative {self.max_rel:.3e}{allowed}")

    def _describe_script(self) -> str:
        if self.kind == "data":
            what = f"{self.where()}, {self.detail}"
        elif self.kind == "setting":  # "at step 2, optimizer setting lr of param group 0: world 2 2e-06, world 1 1e-06"
            what = f"{self.where()}, optimizer setting {self.tensor}: {self.detail}"
        elif self.kind == "ranks":
            what = f"{self.where()}, {self.tensor} on rank {self.rank} differs from rank 0's"
            if self.max_abs is not None:
                what += f" (largest difference {self.max_abs:.3e}; bitwise equality required)"
        else:
            what = (f"{self.where()}, {_SCRIPT_LABELS[self.kind]} {self.tensor}: error {_num(self.max_abs)} against "
                    f"world 1 (allowed {_num(self.allowed)}; relative {_num(self.max_rel)})")
        return f"{what}: {self.diagnosis}"

    def to_json(self) -> dict:
        """Every field (non-finite floats as null), and `replica` beside `rank` (check's reports named it so)."""
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["replica"] = self.rank
        return finite_or_none(out)


def _num(x) -> str:
    return "n/a" if x is None else ("inf" if x == math.inf else f"{x:.3e}")


@dataclass(frozen=True)
class Finding:
    """Something the check noticed about the model or the script that fails nothing by itself
    (`--strict` fails it): its name (`random-layers`, `batch-mixing`, `zero-gradients`, ...), what it
    means and what to do, and the figures behind it where there are some."""

    name: str
    text: str
    errors: dict = field(default_factory=dict)

    def __getitem__(self, key: str):
        # check-script's findings were {"name", "text"} dicts: finding["name"] keeps working.
        if key not in ("name", "text"):
            raise KeyError(key)
        return getattr(self, key)

    def to_json(self) -> dict:
        return finite_or_none({"name": self.name, "text": self.text, **({"errors": self.errors} if self.errors else {})})
