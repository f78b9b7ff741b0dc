"""An optimizer's settings as a step used them, recorded in the rank: every param group's keys but
"params", as plain values (the judge compares them world against world: check/script/optimizer.py)."""

from __future__ import annotations

import torch

__all__ = ["settings_of"]


def settings_of(optimizer) -> list[dict]:
    """Each param group's settings, every key but "params", as plain values (tensors as floats)."""
    return [{k: _plain(v) for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return float(v) if v.numel() == 1 else tuple(float(x) for x in v.flatten().tolist())
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return f"<{type(v).__name__}>"  # an object: its type, not its address
