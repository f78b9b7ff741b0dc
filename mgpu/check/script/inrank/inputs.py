"""What a rank keeps of tensors: whole, or as a digest (`Digest`, `tensor_digest`), and the data
tensors of one root-model forward (`data_record`), by position or keyword (`call_kwargs` finds the
keywords of a call that torch's global forward pre-hooks are not given)."""

from __future__ import annotations

import hashlib
import sys

import torch
from torch import nn

from mgpu.check.script.inrank.records import ForwardRecord

__all__ = ["Digest", "tensor_digest", "call_kwargs", "data_record", "KEEP_INPUT_NUMEL"]

# A forward's data tensors are kept whole up to this many elements (then per-example digests only):
# whole, the comparison can find the batch dimension and strip padding (compare.py).
KEEP_INPUT_NUMEL = 1 << 22


class Digest:
    """A tensor kept as its SHA-1 (of dtype, shape and bytes) where whole tensors would cost too much."""

    __slots__ = ("hex", "shape", "dtype")

    def __init__(self, t: torch.Tensor):
        self.hex, self.shape, self.dtype = tensor_digest(t), tuple(t.shape), str(t.dtype)

    def __eq__(self, other):
        return isinstance(other, Digest) and self.hex == other.hex

    def __hash__(self):
        return hash(self.hex)

    def __getstate__(self):
        return (self.hex, self.shape, self.dtype)

    def __setstate__(self, state):
        self.hex, self.shape, self.dtype = state


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    h = hashlib.sha1(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # a 0-d tensor too
    return h.hexdigest()


def call_kwargs(module: nn.Module) -> dict:
    """The keyword arguments of the module call whose global forward pre-hook is running (torch passes
    global pre-hooks the positional ones only; HF models are called `model(**batch)`): from the frame
    of Module._call_impl (or its inner closure) that holds this module as `self`."""
    frame = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            break
        if frame.f_code.co_name in ("_call_impl", "inner"):
            local = frame.f_locals
            if local.get("self") is module and isinstance(local.get("kwargs"), dict):
                return local["kwargs"]
        frame = frame.f_back
    return {}


def data_record(args: tuple, kwargs: dict) -> ForwardRecord | None:
    """The data tensors of one forward: tensors that are no autograd result and need no gradient
    (activations passed between models are not data), by position or keyword; each kept whole when
    small (KEEP_INPUT_NUMEL in all), else as per-example digests along dim 0."""
    tensors = {}

    def visit(value, key):
        if isinstance(value, torch.Tensor):
            if not value.requires_grad and value.grad_fn is None and type(value).__name__ != "DTensor":
                tensors[key] = value
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(v, f"{key}[{i}]")
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{key}[{k!r}]")
        elif hasattr(value, "keys") and hasattr(value, "__getitem__"):  # BatchEncoding and other mappings
            try:
                for k in value.keys():
                    visit(value[k], f"{key}[{k!r}]")
            except Exception:
                pass

    for i, a in enumerate(args):
        visit(a, f"arg{i}")
    for k, v in kwargs.items():
        visit(v, k)
    if not tensors:
        return None
    total = sum(t.numel() for t in tensors.values())
    kept = {}
    for key, t in tensors.items():
        t = t.detach()
        if total <= KEEP_INPUT_NUMEL:
            kept[key] = t.to("cpu", copy=True)
        else:
            rows = [tensor_digest(t[i]) for i in range(t.shape[0])] if t.dim() else [tensor_digest(t)]
            kept[key] = ("rows", rows, tuple(t.shape), str(t.dtype))
    return ForwardRecord(kept)
