"""CPU memory of a training process: glibc's malloc told to keep freed activation buffers.

Here, not in mgpu/devices.py, so that it imports without torch (a process can be checked for it
in a fraction of a second: correctness/test_devices.py). mgpu.devices re-exports it.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory"]

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed CPU memory for reuse rather than hand it back to the kernel.

    A training step frees and allocates the same activation buffers (megabytes each) every step.
    By default glibc maps large blocks afresh or trims the heap, and the kernel must fault in and
    zero those pages again, every step (what that costs: docs/notes/perf.md, "DDP scaling on a CPU").
    Blocks up to 32 MiB now come from the heap, and up to 1 GiB of freed heap stays with the
    process. Called once per training process (the CLI and the perf sessions do). Returns False
    where the C library has no mallopt (not glibc): nothing changes.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))
