"""The script computed in float64: confirm.py's runs, which tell float32's rounding from the loop.

    with Float64Lift():            # in the rank, around the script (rank.py)
        ...                        # models built in float64; an op mixing float32 with float64 runs in float64
    promote(args, kwargs)          # ScriptMode calls it at every torch function while the lift is on

A float32 computation can carry a rounding-sized difference far: a ReLU or max-pool input within
rounding of its kink goes the other way at world N, and the backward routes that element's gradient
elsewhere (a 2 % difference in one BatchNorm's bias, seen on torchvision's MobileNetV3); a sum whose
terms cancel keeps only their rounding. In float64 such a crossing is 10^9 times rarer, while a bug
in the loop (a factor, other data, a normaliser per rank) is the same size in any precision.

The lift: torch's default dtype float64 while the script runs (its models, and the tensors it makes
from Python numbers, are float64), and every op that mixes float32 tensors with float64 ones gets
its float32 tensors in float64 (`promote`): the data the loader made in float32 meets the first
layer so, and conv2d or linear, which do not mix dtypes, compute in float64. Ops on float32 alone
(the data's own preparation) stay as they are: every world size prepares its examples alike.
"""

from __future__ import annotations

import torch

__all__ = ["Float64Lift", "promote"]


class Float64Lift:
    """torch's default dtype float64 while active (restored after)."""

    def __enter__(self):
        self.saved = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return self

    def __exit__(self, *exc):
        torch.set_default_dtype(self.saved)


# Dunder methods that write into their first argument.
_WRITES_SELF = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__setitem__"}


def _plain(x) -> bool:
    return isinstance(x, torch.Tensor) and type(x) in (torch.Tensor, torch.nn.Parameter)


def _dtypes(values) -> set:
    seen = set()
    for v in values:
        if _plain(v):
            seen.add(v.dtype)
        elif isinstance(v, (list, tuple)):
            seen.update(t.dtype for t in v if _plain(t))
    return seen


def _lifted(v):
    if _plain(v) and v.dtype == torch.float32:
        return v.double()
    if isinstance(v, (list, tuple)) and any(_plain(t) and t.dtype == torch.float32 for t in v):
        return type(v)(t.double() if _plain(t) and t.dtype == torch.float32 else t for t in v) \
            if type(v) in (list, tuple) else v
    return v


def promote(func, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """args and kwargs with their float32 tensors in float64 where the op mixes float32 with float64
    (a tensor, or one in a list or tuple); as they are otherwise. An in-place op keeps its own tensor
    (the first argument: what it writes into) and `out=`."""
    dtypes = _dtypes(args) | _dtypes(kwargs.values())
    if torch.float32 not in dtypes or torch.float64 not in dtypes:
        return args, kwargs
    name = getattr(func, "__name__", "")
    inplace = (name.endswith("_") and not name.endswith("__")) or name in _WRITES_SELF
    first = args[:1] if inplace else ()
    rest = args[1:] if inplace else args
    return (*first, *map(_lifted, rest)), {k: (v if k == "out" else _lifted(v)) for k, v in kwargs.items()}
