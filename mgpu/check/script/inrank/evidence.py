"""Inside a rank: the evidence that a cause needs, beyond the tensors compared (the rules are
docs/guide/check-script.md's "Causes and the evidence they need"; the judge's causes/ states them).

* `suspect_values(t)`: a weight holding uninitialised memory when its model is first called
  (`torch.empty`, `to_empty()` never reset): non-finite values, or magnitudes no initialisation gives.
* `process_group_size()`: torch.distributed's world size at a step (0: no process group).
* `is_setup_step(...)`: an optimizer step made before the model consumed any training data, with
  zero gradients (a `torch.distributed.checkpoint` load steps once so to build the optimizer's
  state): not a training step.
"""

from __future__ import annotations

import math

import torch

from mgpu.check.script.inrank.inputs import Digest, tensor_digest

__all__ = ["suspect_values", "process_group_size", "is_setup_step", "UNINITIALISED_ABOVE"]

# Above this magnitude a freshly built weight is no initialisation's: PyTorch's and the common
# schemes give O(1) (at most a few hundred for an unscaled embedding); uninitialised float32 memory
# holds bit patterns whose magnitudes spread from 1e-38 to 1e38.
UNINITIALISED_ABOVE = 1e6


def suspect_values(t: torch.Tensor) -> tuple[int, float] | None:
    """(how many values are non-finite, the largest finite magnitude) of a floating tensor that holds
    non-finite values or values above UNINITIALISED_ABOVE; None for one that looks initialised."""
    if not t.is_floating_point() or not t.numel():
        return None
    finite = torch.isfinite(t)
    bad = int(t.numel() - finite.sum())
    largest = float(t[finite].abs().max()) if bad < t.numel() else 0.0
    if bad or largest > UNINITIALISED_ABOVE:
        return bad, largest if math.isfinite(largest) else 0.0
    return None


def process_group_size() -> int:
    """The default process group's world size; 0 when torch.distributed is not initialised."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 0


def _is_zero(value) -> bool:
    if value is None:
        return True
    if isinstance(value, Digest):
        dtype = getattr(torch, value.dtype.replace("torch.", ""), None)
        return dtype is not None and value.hex == tensor_digest(torch.zeros(value.shape, dtype=dtype))
    return not bool(value.ne(0).any())


def is_setup_step(grads: dict, forwards: list, forwards_seen: int, counted: int) -> bool:
    """A step that builds the optimizer's state, not a training step: the optimizer's very first
    (counted: its steps so far, set-up steps included), no root model has run a forward with data
    yet (forwards_seen, forwards), and every gradient is None or zero. One at most an optimizer: a
    loop whose forwards the hooks cannot see (`model.forward(x)`) still has its steps counted."""
    return counted == 0 and not forwards and forwards_seen == 0 and all(_is_zero(g) for g in grads.values())
