"""A process's first import of torch, made with the garbage collector paused.

    with imports_uncollected():
        from mgpu.run import train   # imports torch

Importing torch makes some hundreds of thousands of objects, and the collector walks every one made so
far in each full collection it starts meanwhile: several during the import, a tenth or more of its CPU
(docs/notes/suite-times.md). Paused, then the imported objects moved to the permanent generation
(gc.freeze, as Python's docs advise after a process's imports), no collection walks them again.

Only where this is the process's first import of torch (`python -m mgpu train`, the ranks' fork server;
the gate's workers do the same in lines of their own, since the tree they import may predate this
module): where torch is already imported (a test calling mgpu.cli.main, a notebook) the block changes
nothing, so that the caller's garbage is never frozen with it.
"""

from __future__ import annotations

import gc
import sys
from contextlib import contextmanager


@contextmanager
def imports_uncollected():
    if "torch" in sys.modules or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
