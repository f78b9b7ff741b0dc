"""JSON has no infinity and no NaN: a non-finite float is written as null.

    >>> finite_or_none({"max_rel": float("inf"), "steps": [1.5, float("nan")]})
    {'max_rel': None, 'steps': [1.5, None]}

A leaf module (it imports nothing of mgpu), for every writer of strict JSON in mgpu and mgpu_perf.
"""

from __future__ import annotations

import math

__all__ = ["finite_or_none"]


def finite_or_none(value):
    """`value` with every infinite or NaN float in it replaced by None, through dicts, lists and
    tuples (a tuple becomes a list, as JSON writes it); anything else is returned as it is."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value
