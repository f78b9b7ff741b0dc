"""The GPUs' names and clocks, for the machine record of every timed run, and whether the clocks
are locked: boost and temperature move an unlocked GPU's clock, and its timings with it.

    >>> gpu_clocks()        # [] without nvidia-smi (no NVIDIA driver): nothing to record
    [{'index': 0, 'name': 'NVIDIA H200', 'sm_mhz': 345, 'max_sm_mhz': 1980, 'locked': False}]

Read with `nvidia-smi --query-gpu` (the driver's tool, read-only, no Python package needed) before
any benchmark runs, while the GPUs idle. A GPU counts as locked when it idles at its maximum SM
clock: `nvidia-smi --lock-gpu-clocks=MAX,MAX` does that, and an unlocked GPU idles far lower. A GPU
locked below its maximum (at base clock, say) reads as not locked: the warning then says so wrongly.
"""

from __future__ import annotations

import shutil
import subprocess

QUERY = "index,name,clocks.sm,clocks.max.sm"


def gpu_clocks(timeout_s: float = 10.0) -> list[dict]:
    """One dict per GPU nvidia-smi lists; [] when it is missing or fails (then nothing can be said)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        out = subprocess.run([tool, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            continue
        index, name, sm, top = fields
        try:
            sm_mhz, max_mhz = int(float(sm)), int(float(top))
        except ValueError:  # "[N/A]" on GPUs that do not report a clock
            sm_mhz = max_mhz = None
        locked = None if sm_mhz is None or not max_mhz else sm_mhz >= 0.98 * max_mhz
        gpus.append({"index": int(index), "name": name, "sm_mhz": sm_mhz, "max_sm_mhz": max_mhz, "locked": locked})
    return gpus


def unlocked_warning(gpus: list[dict]) -> str | None:
    """A line for the run's output when some GPU's clock is not locked; None when all are (or unknown)."""
    unlocked = [g for g in gpus if g["locked"] is False]
    if not unlocked:
        return None
    which = ", ".join(f"GPU {g['index']} ({g['name']}) idles at {g['sm_mhz']} of {g['max_sm_mhz']} MHz" for g in unlocked)
    return (f"GPU clocks are not locked: {which}. Timings move with boost and temperature; for steadier ones "
            "lock them (`sudo nvidia-smi --lock-gpu-clocks=MAX,MAX`, MAX the maximum SM clock).")
