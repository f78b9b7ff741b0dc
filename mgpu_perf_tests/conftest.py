"""The tests of mgpu_perf itself (the harness, the A/B gate, the counted step, the plugin, the GPU
workflow): not benchmarks, so they live apart from the perf suite (perf/), as pytest-benchmark's own
tests live apart from any benchmarks.

    pytest mgpu_perf_tests                     # about 2 minutes on a 2-core CPU
    pytest mgpu_perf_tests -m "not slow"       # what `make test` runs

The plugin is run on tiny test files and small git repositories with pytester, as a user who
installed mgpu has it; `mgpu gate`, `mgpu bench` and `python -m mgpu_perf ...` are called as functions.
"""

from __future__ import annotations

import importlib.metadata
import os

import pytest


def _plugin_installed() -> bool:
    return any(ep.name == "mgpu_perf.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


@pytest.fixture
def absolute_pythonpath(monkeypatch, pytestconfig):
    """PYTHONPATH's relative folders made absolute from where pytest was started. Without the install
    (`PYTHONPATH=. pytest mgpu_perf_tests`, the way `make gpu-check` runs) mgpu is found through `.`
    alone, and a test that moves into its own folder before starting the gate's workers would lose it."""
    entries = os.environ.get("PYTHONPATH")
    if entries:
        start = pytestconfig.invocation_params.dir  # fixtures such as pytester may have moved by now
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str((start / e).resolve()) if e else e
                                                         for e in entries.split(os.pathsep)))


# What an in-process run (pytester.runpytest_inprocess) imports that this session had not: pytester puts
# sys.modules back as it was when the run ends (and again when its test ends), so the next run imported them
# all again (about 1.5 CPU-s a run of the plugin on the 2-core VM: hypothesis, for its pytest plugin's hooks;
# the gate's workloads; torch's FLOP counter). Imported once, before the first test's pytester takes its
# snapshot, they stay; the user's model file, imported in the run, is still dropped after it and imported
# afresh by the next.
IN_PROCESS_RUN_IMPORTS = ("hypothesis", "mgpu_perf.harness.workloads", "torch.utils.flop_counter")


@pytest.fixture(scope="session")
def _in_process_run_imports():
    for name in IN_PROCESS_RUN_IMPORTS:
        importlib.import_module(name)


@pytest.fixture
def pytester(_in_process_run_imports, pytester, monkeypatch, absolute_pythonpath):
    """pytester with mgpu_perf's plugin, as a user who installed mgpu has it. A run without the install
    has no entry point: there the plugin is named in PYTEST_PLUGINS (and the runs, which start in
    pytester's folder, get an absolute PYTHONPATH)."""
    if not _plugin_installed():
        monkeypatch.setenv("PYTEST_PLUGINS", "mgpu_perf.plugin")  # in-process runs and subprocesses alike
    return pytester


def pytest_configure(config):
    if not any(ep.value == "mgpu_perf.cli" for ep in importlib.metadata.entry_points(group="mgpu.commands")):
        # Not installed (`PYTHONPATH=. pytest mgpu_perf_tests`, as make gpu-check runs): `mgpu bench` and
        # `mgpu gate` are added by name, in this process and in those it starts (mgpu/cli.py, COMMANDS_ENV).
        os.environ.setdefault("MGPU_COMMANDS", "mgpu_perf.cli")
