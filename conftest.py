"""Root conftest: device facts, the GPU gate, hypothesis profiles, benchmark machine info.

Nothing here initialises CUDA: `torch.cuda.device_count()` asks the driver (NVML) only, so
test collection stays cheap and forked test helpers stay safe.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# -- hypothesis profiles: `ci` (chosen when CI is set) is derandomized so CI runs are repeatable.
settings.register_profile("dev", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    return torch.cuda.device_count()


def requires_gpus(n: int = 1):
    """Skip unless at least n CUDA devices exist, with a reason a reader understands."""
    found = gpu_count()
    marks = [pytest.mark.gpu] + ([pytest.mark.multigpu] if n >= 2 else [])
    skip = pytest.mark.skipif(found < n, reason=f"needs {n} CUDA device{'s' if n > 1 else ''} (found {found})")
    return lambda f: functools.reduce(lambda g, m: m(g), [*marks, skip], f)


@pytest.fixture(autouse=True)
def _no_tf32():
    """Correctness means bit-for-bit fp32 math on GPUs too: TF32 off, tolerances untouched."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def pytest_report_header(config):
    n = gpu_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(n)) if n else "none: CPU only, devices emulated"
    return [f"mgpu: torch {torch.__version__}, CUDA devices: {n} ({names}), CPU threads: {torch.get_num_threads()}"]


def pytest_benchmark_update_machine_info(config, machine_info):
    n = gpu_count()
    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda
    machine_info["cudnn"] = torch.backends.cudnn.version() if n else None
    machine_info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if n else None
    machine_info["gpu_count"] = n
    machine_info["gpus"] = [torch.cuda.get_device_name(i) for i in range(n)]
    machine_info["cpu_threads"] = torch.get_num_threads()
