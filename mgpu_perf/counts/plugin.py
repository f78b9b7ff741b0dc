"""The counted baseline in the repository, as pytest runs it: each gated benchmark's counted step
saved to, or checked against, a JSON file beside the code (counts/baseline.py), with no second arm.

    pytest perf --devices 2 --counts-save perf/counts-cpu.json     # write (or update) the file
    pytest perf --devices 2 --counts-check perf/counts-cpu.json    # the step of each gated benchmark, counted

Registered by the plugin (mgpu_perf/plugin.py) when --counts-save or --counts-check is given
(counts/options.py declares them). Only the tests marked `mgpu_gate` run, and their bodies do not:
each marker's workload is built in this process, stepped twice (the warm-up), and one more step is
counted, as a gate worker counts it (counts/workload.py). Nothing is timed and no baseline is checked
out. The workloads whose steps run in rank processes (ddp, fsdp) are counted ahead, beside the
in-process ones, on a CPU (counts/ahead.py): their counts are the ranks' own, the same either way.

What each status of the check does here: `slower (counted)` and `fewer (counted)` fail the test (the
second with the command that updates the file); `not comparable` skips it, says both environments and
the update command, and the run exits EXIT_NOT_COMPARABLE (mgpu/errors.py), never 0; `no entry` skips
it; under --counts-strict those two fail too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mgpu.errors import EXIT_NOT_COMPARABLE
from mgpu_perf.counts.ahead import CountsAhead, can_count_ahead, in_process_first, spawns_ranks_of
from mgpu_perf.counts.baseline import (Checked, check_entry, describe_environment, describe_workload, environment,
                                       merge_entries, read_file, update_command, workload_key, write_file)
from mgpu_perf.counts.judge import FEWER_COUNTED, NO_ENTRY, NOT_COMPARABLE, SLOWER_COUNTED
from mgpu_perf.counts.workload import count_built, count_workload
from mgpu_perf.markers import keep_gated

__all__ = ["PLUGIN", "CountsBaseline", "register"]

PLUGIN = "mgpu-counts-baseline"  # mgpu_perf/plugin.py's COUNTS_PLUGIN


class CountsBaseline:
    """The pytest side: the gated tests' counted steps saved to, or checked against, the file."""

    def __init__(self, config, save: str | None, check: str | None, strict: bool):
        if save and check:
            raise pytest.UsageError("--counts-save and --counts-check: one at a time")
        if config.getoption("ab_baseline") or config.getoption("ab_baseline_python"):
            raise pytest.UsageError("--counts-save/--counts-check and the A/B gate (--ab-baseline): one at a time")
        self.config, self.strict = config, strict
        self.path = Path(save or check)
        self.saving = bool(save)
        self.entries: list[dict] = []
        if not self.saving:
            if not self.path.is_file():
                raise pytest.UsageError(f"--counts-check {check}: no such file (write it with --counts-save {check})")
            try:
                self.entries = read_file(self.path)
            except (ValueError, KeyError) as e:
                raise pytest.UsageError(str(e)) from None
        self.update = update_command(list(config.invocation_params.args), str(self.path)) if not self.saving else ""
        self.root = Path(config.invocation_params.dir)
        self.specs: dict[str, dict] = {}
        self.saved: list[dict] = []
        self.results: dict[str, Checked] = {}
        self.ahead: CountsAhead | None = None
        config.addinivalue_line("filterwarnings", "ignore:Benchmark fixture was not used")

    def pytest_collection_modifyitems(self, config, items):
        self.specs.update(keep_gated(config, items))
        items[:] = in_process_first(items, {n for n, spec in self.specs.items() if spawns_ranks_of(spec)})

    def pytest_collection_finish(self, session):
        """The rank workloads that will run (after -k and the like) counted ahead, where it can be."""
        ahead = {i.nodeid: self.specs[i.nodeid] for i in session.items
                 if i.nodeid in self.specs and spawns_ranks_of(self.specs[i.nodeid])}
        if ahead and not self.config.option.collectonly and can_count_ahead(self.root)[0]:
            self.ahead = CountsAhead(count_built, ahead)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        spec = self.specs.get(pyfuncitem.nodeid)
        if spec is None:
            return None
        ahead = self.ahead is not None and pyfuncitem.nodeid in self.ahead
        counts = self.ahead.result(pyfuncitem.nodeid) if ahead else count_workload(spec, self.root)
        key, env = workload_key(spec), environment()
        if self.saving:
            self.saved.append({"workload": key, "environment": env,
                               "test": pyfuncitem.nodeid, "counts": counts})
            return True
        checked = check_entry(self.entries, key, env, counts)
        self.results[pyfuncitem.nodeid] = checked
        if checked.status == SLOWER_COUNTED:
            pytest.fail(f"{SLOWER_COUNTED}: " + "; ".join(checked.increases), pytrace=False)
        if checked.status == FEWER_COUNTED:
            pytest.fail(f"{FEWER_COUNTED}: " + "; ".join(checked.decreases) + f" (the step does less than "
                        f"{self.path} says: update it, and commit it, with: {self.update})", pytrace=False)
        if checked.status in (NOT_COMPARABLE, NO_ENTRY):
            message = f"{checked.status}: {checked.reason}" + (
                f" (update the file with: {self.update})" if checked.status == NOT_COMPARABLE else "")
            if self.strict:
                pytest.fail(message + " [--counts-strict]", pytrace=False)
            pytest.skip(message)
        return True

    def pytest_sessionfinish(self, session, exitstatus):
        if self.ahead is not None:
            self.ahead.close()
        if self.saving and self.saved:
            old = read_file(self.path) if self.path.is_file() else []
            write_file(self.path, merge_entries(old, self.saved))
        elif session.exitstatus == 0 and any(c.status == NOT_COMPARABLE for c in self.results.values()):
            session.exitstatus = EXIT_NOT_COMPARABLE

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        if self.saving:
            if self.saved:
                tr.section(f"mgpu counted baseline: {len(self.saved)} benchmark(s) written to {self.path}")
                for entry in self.saved:
                    tr.write_line(f"{entry['test']}: {describe_workload(entry['workload'])}, "
                                  f"{describe_environment(entry['environment'])}")
            return
        if not self.results:
            return
        tr.section(f"mgpu counted baseline: the working tree against {self.path}")
        for nodeid, checked in self.results.items():
            lines = checked.increases + checked.decreases + checked.reported
            tr.write_line(f"{nodeid}: {checked.status}" + (f": {checked.reason}" if checked.reason else "")
                          + (": " + "; ".join(lines[:6]) if lines else ""))
        statuses = {c.status for c in self.results.values()}
        if NOT_COMPARABLE in statuses:
            tr.write_line(f"NOT COMPARABLE: an entry of {self.path} was recorded under another torch or device; "
                          f"nothing was checked for it (exit {EXIT_NOT_COMPARABLE}). Update the file with: "
                          f"{self.update}", red=True, bold=True)
        if FEWER_COUNTED in statuses:
            tr.write_line(f"a guarded count fell: the file is a ratchet; update it with: {self.update}", yellow=True)


def register(config, save: str | None, check: str | None, strict: bool) -> None:
    """The plugin's entry (mgpu_perf/plugin.py): a UsageError on bad options, before anything runs."""
    config.pluginmanager.register(CountsBaseline(config, save, check, strict), PLUGIN)
