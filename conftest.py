"""Root conftest: device facts, the GPU gates (`requires_gpus(n)`, `requires_no_cuda(why)`), hypothesis
profiles, benchmark machine info.

Nothing here initialises CUDA: `torch.cuda.device_count()` asks the driver (NVML) only, so
test collection stays cheap and forked test helpers stay safe.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from mgpu.devices import gpu_count

# -- hypothesis profiles: `ci` (chosen when CI is set) is derandomized so CI runs are repeatable.
settings.register_profile("dev", max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def requires_gpus(n: int = 1):
    """Skip unless at least n CUDA devices exist, with a reason a reader understands."""
    found = gpu_count()
    marks = [pytest.mark.gpu] + ([pytest.mark.multigpu] if n >= 2 else [])
    skip = pytest.mark.skipif(found < n, reason=f"needs {n} CUDA device{'s' if n > 1 else ''} (found {found})")
    return lambda f: functools.reduce(lambda g, m: m(g), [*marks, skip], f)


def requires_no_cuda(why: str):
    """Skip when any CUDA device is present: for behaviour that exists only without CUDA (e.g.
    DataParallel's pass-through on the CPU). `why` says what the test checks instead on GPUs."""
    found = gpu_count()
    return pytest.mark.skipif(found > 0, reason=f"needs a machine without CUDA (found {found} CUDA device"
                                                f"{'s' if found != 1 else ''}): {why}")


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
    # Benchmarks run PyTorch's defaults (the TF32-off fixture is correctness/'s only): record them.
    machine_info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    machine_info["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    machine_info["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    machine_info["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    machine_info["cudnn_deterministic"] = torch.backends.cudnn.deterministic
