"""Perf-suite options, the device sweep, and the scaling table at the end of a run.

    pytest perf                          # real timings (a few minutes on a 2-core CPU)
    pytest perf --benchmark-disable      # every benchmark once, as CI does: a broken benchmark fails
    pytest perf --devices 4 --perf-out perf-results/run1

    pytest perf --model examples/tiny_lm.py:spec   # the training benchmarks on your model instead

Options: `--devices N|LIST` (or MGPU_PERF_DEVICES) overrides the device counts taken from the
machine; `--perf-out DIR` (mgpu's plugin; or MGPU_PERF_OUT, default perf-results/) is where
scaling.json and scaling.png go; `--model MODULE:FUNCTION` (the root conftest's) runs the training
step benchmarks on that model and deselects the rest. The harness and the A/B gate are the
installed package `mgpu_perf` (its pytest plugin); this folder is the suite, and the harness's and
the gate's own tests are in mgpu_perf_tests/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mgpu.devices import torch_threads
from mgpu_perf import scaling
from mgpu_perf.clocks import gpu_clocks, unlocked_warning
from mgpu_perf.harness.sessions import cpu_cores
from mgpu_perf.plugin import GATE_PLUGIN, out_dir
from mgpu_perf.sweep import CLOCKS_KEY, ROWS_KEY, SWEEP_KEY, make_sweep

# With --model, the benchmarks that run on any model; the rest time mgpu's own network and kernels.
MODEL_BENCHMARKS = ("test_train_step", "test_rank_scaling_interleaved")


def pytest_addoption(parser):
    group = parser.getgroup("mgpu perf")
    group.addoption("--devices", default=None, metavar="N|LIST",
                    help="device counts to sweep: N (1, 2, 4, ..., N) or a list like 1,3; "
                         "default: the CUDA devices, else one emulated device per CPU core (at most 4)")


def pytest_configure(config):
    try:
        config.stash[SWEEP_KEY] = make_sweep(config.getoption("--devices"))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[ROWS_KEY] = []
    config.stash[CLOCKS_KEY] = gpu_clocks()  # before anything runs: the clocks of idle GPUs


def pytest_collection_modifyitems(config, items):
    """--model: only the training benchmarks that run on any model (the root conftest checked the model)."""
    if config.getoption("model", None) is None:
        return
    perf_dir = Path(__file__).parent
    kept = [i for i in items if Path(str(i.path)).parent != perf_dir or i.originalname in MODEL_BENCHMARKS]
    dropped = [i for i in items if i not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config):
    s = config.stash[SWEEP_KEY]
    cpu = "" if s.gpus else f", {s.threads_per_device} CPU thread(s) per emulated device ({cpu_cores()} cores)"
    lines = [f"mgpu perf: device counts {list(s.counts)} ({s.source}){cpu}"]
    if config.getoption("model", None):
        lines.append(f"mgpu perf: model {config.getoption('model', None)} (--model): training step benchmarks only")
    gpus = config.stash[CLOCKS_KEY]
    if gpus:
        lines.append("GPU clocks at start: " + "; ".join(
            f"{g['index']} {g['name']} {g['sm_mhz']}/{g['max_sm_mhz']} MHz "
            f"({'locked' if g['locked'] else 'not locked' if g['locked'] is False else 'unknown'})" for g in gpus))
    warning = unlocked_warning(gpus)
    if warning:
        lines.append(f"WARNING: {warning}")
    return lines


def pytest_benchmark_update_machine_info(config, machine_info):
    """The GPUs' names, maximum clocks and whether they were locked (mgpu_perf/clocks.py); the root
    conftest records versions and PyTorch's settings. Not the idle clock itself: it differs from
    run to run, and pytest-benchmark warns on every --benchmark-compare whose machine_info differs."""
    machine_info["gpu_clocks"] = [{k: g[k] for k in ("index", "name", "max_sm_mhz", "locked")}
                                  for g in config.stash[CLOCKS_KEY]]


@pytest.fixture(scope="session")
def sweep(pytestconfig):
    return pytestconfig.stash[SWEEP_KEY]


@pytest.fixture(scope="session")
def scaling_rows(pytestconfig) -> list[dict]:
    """Training benchmarks append their results here for the table at the end."""
    return pytestconfig.stash[ROWS_KEY]


@pytest.fixture
def cpu_threads(sweep):
    """Give this test `sweep.threads_per_device` torch threads on a CPU machine; restore after."""
    with torch_threads(sweep.threads_per_device or None):
        yield sweep.threads_per_device


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    tr = terminalreporter
    warning = unlocked_warning(config.stash.get(CLOCKS_KEY, []))
    if warning and not config.pluginmanager.has_plugin(GATE_PLUGIN) and not config.getoption("benchmark_disable"):
        tr.write_line(f"WARNING: {warning}")  # again at the end: -q hides the header (the gate says it in its own section)
    rows = config.stash.get(ROWS_KEY, [])
    if not rows:
        return
    s = config.stash[SWEEP_KEY]
    tr.section("mgpu scaling (weak: fixed per-device batch)")
    if all(r["images_per_s"] is None for r in rows):
        tr.write_line("no timings: benchmarks were disabled (--benchmark-disable); nothing written")
        return
    rows = scaling.add_speedups([r for r in rows if r["images_per_s"] is not None])
    for line in scaling.format_table(rows):
        tr.write_line(line)
    emulated = any(r["emulated"] for r in rows)
    model = config.getoption("model", None) or "ResNet-18"
    meta = {"title": f"{model} weak scaling, {'emulated CPU devices' if emulated else 'GPUs'}",
            "scaling": "weak", "emulated": emulated, "gpus": s.gpus, "device_counts": list(s.counts),
            "threads_per_device": s.threads_per_device, "cpu_cores": cpu_cores(), "torch": torch.__version__}
    for path in scaling.write_outputs(rows, meta, out_dir(config)):
        tr.write_line(f"wrote {path}")
