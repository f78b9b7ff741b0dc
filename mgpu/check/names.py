"""A check package's public names, imported on first use (PEP 562): each check's package (check/model,
check/script) is imported by its command line and its ranks, which need none of its heavy modules.

    __getattr__ = names_on_first_use(__name__, {"run_check": "mgpu.check.model.check", ...})
"""

from __future__ import annotations

from importlib import import_module
from typing import Callable

__all__ = ["names_on_first_use"]


def names_on_first_use(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `where[name]` (a module path) the first time `name` is asked for."""
    def __getattr__(name: str):
        if name in where:
            return getattr(import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
