"""The gate inside pytest: registered by the plugin (plugin.py) when --ab-baseline or
--ab-baseline-python is given. Only tests marked `mgpu_gate` run; each one's body is replaced by
the A/B comparison of its marker's workload (gate/run.py), and the run's exit status is the gate's.

Outcome: pytest exits 1 if any gated test is `slower` (`inconclusive` too with --ab-strict); a worker
that crashes, a workload that fails or computes a wrong result in either arm fails that test (the
message names the arm): never "unchanged". A workload the baseline cannot set up is skipped as `not
comparable`, with the reason. Bad options or a bad REF: pytest's usage error (exit 4) before anything
starts; a baseline whose code cannot start a worker stops the run with exit 4 at the first gated test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu_perf.clocks import gpu_clocks
from mgpu.errors import MgpuError
from mgpu_perf.errors import GateError
from mgpu_perf.gate.settings import Settings
from mgpu_perf.gate.baseline import read_trees, repository_root
from mgpu_perf.gate.run import GateRun
from mgpu_perf.markers import keep_gated

__all__ = ["ABGate"]


def settings_from(config) -> Settings:
    """The plugin's --ab-* options (declared in Settings), read back; GateError naming a bad one."""
    return Settings.read(lambda name: config.getoption("ab_" + name), prefix="ab-",
                         smoke=bool(config.getoption("benchmark_disable", False)))


class ABGate:
    def __init__(self, config, out_dir: Path):
        """`out_dir`: where the reports go (the plugin's --perf-out, which it owns with its options)."""
        self.config = config
        self.out_dir = out_dir
        # The gated tests' bodies are replaced by the A/B pair: their benchmark fixture stays unused.
        config.addinivalue_line("filterwarnings", "ignore:Benchmark fixture was not used")
        self.specs: dict[str, dict] = {}
        self.family_size = 1
        try:
            settings = settings_from(config)
            trees = read_trees(repository_root(Path(config.invocation_params.dir)), config.getoption("ab_baseline"),
                               config.getoption("ab_baseline_python"))
            self.run = GateRun(settings, trees, gpu_clocks=gpu_clocks())
        except MgpuError as e:  # GateError and every other bad input; MgpuError, since pytester's in-process
            raise pytest.UsageError(str(e)) from None  # runs can leave mgpu_perf.errors imported twice

    def pytest_collection_modifyitems(self, config, items):
        self.specs.update(keep_gated(config, items))
        self.family_size = max(1, len(items))

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        if pyfuncitem.nodeid not in self.specs:
            return None
        try:
            result = self.run.compare(pyfuncitem.nodeid, self.specs[pyfuncitem.nodeid], self.family_size)
        except GateError as e:
            pytest.exit(f"mgpu A/B gate: {e}", returncode=pytest.ExitCode.USAGE_ERROR)
        if result.status == "not comparable":
            pytest.skip(f"not comparable: {result.reason}")
        if result.status == "undecidable":  # no verdict, and said so (a failure with --ab-strict, at the end)
            pytest.skip(f"undecidable: {result.reason}")
        return True

    def pytest_sessionfinish(self, session, exitstatus):
        status = self.run.finish(self.out_dir)
        if session.exitstatus == 0:
            session.exitstatus = status

    def pytest_terminal_summary(self, terminalreporter):
        if not self.run.started:
            return  # nothing ran (--collect-only, or nothing gated): nothing to report
        tr = terminalreporter
        tr.section(f"mgpu A/B gate: baseline {self.run.trees.baseline_desc} vs the working tree")
        for line in self.run.summary_lines():
            tr.write_line(line)

    def pytest_unconfigure(self, config):
        self.run.close()
