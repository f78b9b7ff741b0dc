"""mgpu.startup: a process's first import of torch is made with the garbage collector paused, then
what it imported is frozen; anywhere torch is already imported the block changes nothing."""

import gc
import subprocess
import sys

import pytest

FIRST_IMPORT = """
import gc
from mgpu.startup import imports_uncollected
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
with imports_uncollected():
    enabled_inside = gc.isenabled()
    import torch
print(enabled_inside, gc.isenabled(), gc.get_freeze_count(), len(collections))
"""


@pytest.mark.timeout(120)
def test_the_first_import_of_torch_is_not_collected_and_is_frozen_after():
    proc = subprocess.run([sys.executable, "-c", FIRST_IMPORT], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr
    enabled_inside, enabled_after, frozen, collections = proc.stdout.split()
    assert (enabled_inside, enabled_after) == ("False", "True"), f"collector enabled inside / after: {proc.stdout}"
    assert int(collections) == 0, f"{collections} collections ran during the import"
    assert int(frozen) > 100_000, f"only {frozen} objects frozen after importing torch"


def test_where_torch_is_already_imported_nothing_is_paused_or_frozen():
    from mgpu.startup import imports_uncollected

    assert "torch" in sys.modules and gc.isenabled()
    frozen = gc.get_freeze_count()
    with imports_uncollected():
        assert gc.isenabled(), "the collector was paused in a process that had imported torch"
    assert gc.get_freeze_count() == frozen and gc.isenabled(), "the caller's objects were frozen"
