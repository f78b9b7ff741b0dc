"""Root conftest: device facts, the GPU gate (`requires_gpus(n)`), benchmark
machine info, `--model MODULE:FUNCTION` (your model instead of mgpu's own), the garbage
collector's permanent generation after collection, and pytester runs that keep the libraries they import.

Nothing here initialises CUDA: `torch.cuda.device_count()` asks the driver (NVML) only, so
test collection stays cheap and forked test helpers stay safe.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import sysconfig

import _pytest.pytester
import pytest
import torch

from mgpu.devices import gpu_count

# pytester: the plugins' own tests run them on tiny test files. mgpu_perf.plugin: installed, it is
# already registered under this name (its pytest11 entry point); run from a checkout with
# PYTHONPATH=. and no install (make gpu-check), this registers it.
pytest_plugins = ["pytester", "mgpu_perf.plugin"]

def pytest_addoption(parser):
    group = parser.getgroup("mgpu", "mgpu: your own model")
    if any("--model" in option.names() for option in group.options):
        # Another copy of this file registered them: pytest takes the DIR of `--ab-baseline DIR`
        # (the A/B gate's baseline tree) for a test path and loads that tree's conftest.py too.
        return
    group.addoption("--model", metavar="MODULE:FUNCTION", default=None,
                    help="run the parity properties (correctness/test_parity.py) on this model instead of mgpu's "
                         "LeNet and ResNet-18, every other correctness test deselected (the contract: docs/guide/check.md)")
    group.addoption("--input-shape", metavar="C,H,W", default=None,
                    help="with --model returning an nn.Module of images: the shape of one input")
    group.addoption("--classes", metavar="N", type=int, default=None,
                    help="with --model returning an nn.Module of images: the number of classes")
    group.addoption("--parity-examples", metavar="N", type=int, default=8,
                    help="hypothesis examples per parity property for --model (default 8; each is a few steps "
                         "of every strategy it draws)")


def pytest_configure(config):
    """A bad --model is a usage error of one line, before anything is collected."""
    from mgpu.errors import MgpuError, one_line

    if hasattr(config, "mgpu_model_spec"):  # configured by another copy of this file (see pytest_addoption)
        return
    target = config.getoption("model")
    if target is None:
        if config.getoption("input_shape") is not None or config.getoption("classes") is not None:
            raise pytest.UsageError("--input-shape and --classes describe the inputs of --model MODULE:FUNCTION: "
                                    "give --model too")
        config.mgpu_model_spec = None
        return
    if config.getoption("parity_examples") < 1:
        raise pytest.UsageError(f"--parity-examples must be at least 1, got {config.getoption('parity_examples')}")
    from mgpu.spec import load_spec, validate_spec

    try:
        spec = load_spec(target, input_shape=config.getoption("input_shape"), classes=config.getoption("classes"))
        validate_spec(spec, batch_size=4, seed=0)
    except MgpuError as e:
        raise pytest.UsageError(f"--model {target}: {one_line(e)}") from None
    config.mgpu_model_spec = spec


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Move what collection left alive (torch, hypothesis, every test module: hundreds of thousands of
    objects) into the garbage collector's permanent generation. A full collection otherwise walks all
    of them each time the tests' own allocations trigger one, which made the cyclic collector a large
    share of a test process's CPU (docs/notes/suite-times.md, 2026-11-28). The objects stay as they
    are; what the tests allocate is still collected. Garbage first, so that none is kept for good."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)  # the old style: the GPU machine's pytest may predate wrapper=True
def pytest_runtest_protocol(item, nextitem):
    """A test with pytester keeps what its in-process pytest runs import of libraries (mgpu, torch, the
    project's helpers). pytester puts sys.modules back as it was before each such run, so that the next
    run imports its test files anew; but a library module first imported during the run (mgpu.run, when
    the inner session collected correctness/) then left sys.modules while its package still held it.
    Later in this process `from mgpu import run` and `from mgpu.run import train` named two modules: a
    test that patched the first ran a full-size training through the second (still running 400 s on at
    generic kernels), and torch, importing its dropped torch._inductor.test_operators again, failed to
    register those operators twice. Test files, conftests and files outside the project still go."""
    if "pytester" not in getattr(item, "fixturenames", ()):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_pytest.pytester, "SysModulesSnapshot", _keeping_libraries(item.config.rootpath))
        yield


def _keeping_libraries(root):
    libraries = tuple(os.path.join(path, "") for path in {str(root), *sysconfig.get_paths().values()})

    def is_library(name: str) -> bool:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path is None:  # built in, frozen or a namespace package
            return True
        base = os.path.basename(path)
        test_code = base == "conftest.py" or base.startswith("test_") or base.endswith("_test.py")
        return path.startswith(libraries) and not test_code

    class SnapshotKeepingLibraries(_pytest.pytester.SysModulesSnapshot):
        def __init__(self, preserve=None):
            super().__init__(preserve=lambda name: is_library(name) or (preserve is not None and preserve(name)))

    return SnapshotKeepingLibraries


def requires_gpus(n: int = 1):
    """Skip unless at least n CUDA devices exist, with a reason a reader understands."""
    found = gpu_count()
    marks = [pytest.mark.gpu] + ([pytest.mark.multigpu] if n >= 2 else [])
    skip = pytest.mark.skipif(found < n, reason=f"needs {n} CUDA device{'s' if n > 1 else ''} (found {found})")
    return lambda f: functools.reduce(lambda g, m: m(g), [*marks, skip], f)


def pytest_report_header(config):
    n = gpu_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(n)) if n else "none: CPU only, devices emulated"
    from mgpu.devices import comparison_kind

    lines = [f"mgpu: torch {torch.__version__}, CUDA devices: {n} ({names}), CPU threads: {torch.get_num_threads()}, "
             f"CPU kernels: {torch.backends.cpu.get_cpu_capability()} (ONEDNN_MAX_CPU_ISA "
             f"{os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')})"]
    if any("correctness" in str(arg) for arg in config.args):
        from correctness.helpers import MOST_DEVICES as most

        kind = comparison_kind(most, n)
        where = (f"on the GPUs ({n} >= {most})" if kind == "cuda" else
                 f"everything on the CPU, one-device references included ({n} CUDA device{'s' if n != 1 else ''}, "
                 f"fewer than the {most} the largest comparison uses)" if n else "on the CPU")
        lines.append(f"mgpu: correctness comparisons run {where}")
    return lines


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
