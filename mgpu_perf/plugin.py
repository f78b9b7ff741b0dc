"""mgpu's pytest plugin (entry point `pytest11`): the A/B gate's options, the `mgpu_gate` marker and
the `mgpu_workload` fixture, in every pytest run of an environment where mgpu is installed.

    pytest --ab-baseline origin/main                       # gate the tests marked mgpu_gate
    pytest --ab-baseline HEAD --ab-threshold 5 --ab-max-rounds 60 --ab-strict
    pytest --ab-baseline-python ~/venv-old/bin/python      # same tree, another torch/CUDA/NCCL

Loaded everywhere, so it costs nothing unless used: this module imports no torch and of mgpu only its
option declarations (mgpu/options.py and the gate's Settings, gate/settings.py: leaves without torch),
adds no header or summary line, and starts no process. The gate (gate/session.py) is imported and
registered only when --ab-baseline or --ab-baseline-python is given; its workers start when the
first gated test runs (`--collect-only` starts nothing).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from mgpu.options import Options, option
from mgpu_perf.counts.options import add_counts_baseline_options
from mgpu_perf.gate.settings import Settings
from mgpu_perf.markers import MARKER, MARKER_HELP

ENV_OUT = "MGPU_PERF_OUT"
DEFAULT_OUT = "perf-results"
GATE_PLUGIN = "mgpu-ab-gate"
COUNTS_PLUGIN = "mgpu-counts-baseline"  # counts/plugin.PLUGIN (not imported: it imports mgpu and the harness)


@dataclass(frozen=True, kw_only=True)
class PluginOptions(Options):
    """The plugin's own options beside the gate's Settings: --ab-baseline, --ab-baseline-python (with
    the prefix "ab-") and --perf-out (without)."""

    baseline: str | None = option(None, metavar="REF",
                                  help="A/B gate: time the mgpu_gate tests against REF, a git revision of this "
                                       "repository or another checkout of it")
    baseline_python: str | None = option(None, metavar="PATH",
                                         help="A/B gate: run the baseline arm with this Python (another "
                                              "torch/CUDA/NCCL), same tree unless --ab-baseline names another")
    perf_out: str | None = option(None, metavar="DIR",
                                  help=f"folder for ab.json and the perf suite's outputs (default ${ENV_OUT} or "
                                       f"{DEFAULT_OUT}/)")


def pytest_addoption(parser):
    group = parser.getgroup("mgpu", "mgpu: A/B regression gate (docs/guide/gate.md)")
    PluginOptions.add_to(group.addoption, prefix="ab-", only=("baseline", "baseline_python"), pytest=True)
    Settings.add_to(group.addoption, prefix="ab-", pytest=True, show_defaults=True)  # threshold, rounds, workers, ...
    PluginOptions.add_to(group.addoption, only=("perf_out",), pytest=True)
    add_counts_baseline_options(group.addoption)  # --counts-save/--counts-check FILE (counts/options.py)


def gate_requested(config) -> bool:
    return bool(config.getoption("ab_baseline") or config.getoption("ab_baseline_python"))


def out_dir(config) -> Path:
    return Path(config.getoption("perf_out") or os.environ.get(ENV_OUT) or DEFAULT_OUT)


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER_HELP)
    if gate_requested(config):
        from mgpu_perf.gate.session import ABGate  # bad input: a UsageError, nothing started

        config.pluginmanager.register(ABGate(config, out_dir(config)), GATE_PLUGIN)
    if config.getoption("counts_save") or config.getoption("counts_check"):
        from mgpu_perf.counts.plugin import register  # bad input: a UsageError, nothing started

        register(config, config.getoption("counts_save"), config.getoption("counts_check"),
                 bool(config.getoption("counts_strict") or config.getoption("strict", False)))


@pytest.fixture
def mgpu_workload(request):
    """The workload of this test's `mgpu_gate` marker, built in this process: `op()` is one timed
    unit (a training step), checked (finite losses, weights moved) and closed after the test.
    Under the gate the test body does not run, and nothing is built here."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        pytest.fail(f"the mgpu_workload fixture needs an @pytest.mark.{MARKER}(...) marker on the test", pytrace=False)
    if request.config.pluginmanager.has_plugin(GATE_PLUGIN) or request.config.pluginmanager.has_plugin(COUNTS_PLUGIN):
        yield None
        return
    from mgpu_perf.harness.workloads import make_gated
    from mgpu_perf.markers import marker_spec

    try:
        spec = marker_spec(marker)
    except ValueError as e:
        pytest.fail(str(e), pytrace=False)
    workload = make_gated(spec)
    try:
        yield workload
        workload.check()
    finally:
        workload.close()
