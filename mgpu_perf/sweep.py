"""What the perf suite sweeps and how it labels it: device counts, emulated devices, threads.

Device counts come from the machine: its CUDA devices, or on a machine without them one emulated
device per CPU core (at most 4 by default). `--devices N` (sweep 1, 2, 4, ..., N) or
`--devices 1,3` (exactly these), or the environment variable MGPU_PERF_DEVICES, overrides it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from mgpu_perf.harness.sessions import cpu_cores

ENV_DEVICES = "MGPU_PERF_DEVICES"
MAX_EMULATED_BY_DEFAULT = 4
SWEEP_KEY = pytest.StashKey()  # config.stash: the Sweep of this session
ROWS_KEY = pytest.StashKey()   # config.stash: scaling rows the training benchmarks add
CLOCKS_KEY = pytest.StashKey()  # config.stash: the GPUs' names and clocks at start (mgpu_perf/clocks.py)


@dataclass(frozen=True)
class Sweep:
    counts: tuple[int, ...]  # device counts to benchmark, ascending, starting at 1 unless overridden
    gpus: int                # CUDA devices on this machine
    source: str              # where the counts came from, for the report header

    @property
    def max_count(self) -> int:
        return self.counts[-1]

    def emulated(self, n: int) -> bool:
        """True when n devices are not all real GPUs: CPU replicas or CPU ranks."""
        return n > self.gpus and n > 1

    def on_gpu(self, n: int) -> bool:
        return self.gpus >= n

    def label(self, n: int, unit: str = "dev") -> str:
        """A test-id fragment: `2gpu`, `1cpu`, `2dev-emulated` (replicas) or `2ranks-cpu` (DDP)."""
        if self.on_gpu(n):
            return f"{n}gpu"
        if unit == "ranks":
            return f"{n}ranks-cpu"
        return "1cpu" if n == 1 else f"{n}{unit}-emulated"

    @property
    def threads_per_device(self) -> int | None:
        """CPU: every emulated device gets the same share of the cores at every count, so that a
        speedup measures parallel execution, not more threads. None on GPU machines."""
        if self.gpus:
            return None
        return max(1, cpu_cores() // self.max_count)

    def collective_counts(self) -> tuple[int, ...]:
        """Collectives need two devices at least: the counts >= 2, else 2 (emulated if need be)."""
        return tuple(n for n in self.counts if n >= 2) or (2,)


def parse_counts(text: str) -> tuple[int, ...]:
    """`4` -> (1, 2, 4); `6` -> (1, 2, 4, 6); `1,3` -> (1, 3)."""
    text = text.strip()
    try:
        if "," in text:
            counts = sorted({int(c) for c in text.split(",") if c.strip()})
        else:
            top = int(text)
            counts = sorted({*(2**k for k in range(top.bit_length()) if 2**k <= top), top})
    except ValueError:
        raise ValueError(f"device counts must be N or a list like 1,2,4; got {text!r}") from None
    if not counts or counts[0] < 1:
        raise ValueError(f"device counts must be positive; got {text!r}")
    return tuple(counts)


def make_sweep(option: str | None) -> Sweep:
    gpus = torch.cuda.device_count()
    if option:
        return Sweep(parse_counts(option), gpus, f"--devices {option}")
    if os.environ.get(ENV_DEVICES):
        return Sweep(parse_counts(os.environ[ENV_DEVICES]), gpus, f"{ENV_DEVICES}={os.environ[ENV_DEVICES]}")
    if gpus:
        return Sweep(parse_counts(str(gpus)), gpus, f"{gpus} CUDA device(s)")
    top = max(1, min(cpu_cores(), MAX_EMULATED_BY_DEFAULT))
    return Sweep(parse_counts(str(top)), gpus, f"no CUDA: {top} emulated device(s), one per CPU core")


def record_rate(benchmark, work: float, unit: str, per_device: int | None = None) -> float | None:
    """Put `work` / median time in extra_info as `unit` (e.g. GFLOP/s); None when benchmarks are
    disabled (no timings)."""
    if benchmark.stats is None:
        return None
    rate = work / benchmark.stats.stats.median
    benchmark.extra_info[unit] = round(rate, 3)
    if per_device:
        benchmark.extra_info[f"{unit} per device"] = round(rate / per_device, 3)
    return rate
