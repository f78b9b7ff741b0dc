"""One gate run, whoever starts it (the pytest plugin or `python -m mgpu gate`): its Settings (read
from the options by gate/settings.py), the two trees, the two arms (started when the first gated
benchmark runs), the comparisons, the verdicts and the reports.

    run = GateRun(Settings.from_values({"threshold": "10", "max_rounds": "200"}), read_trees(root, "origin/main"))
    run.compare("my_step[ddp-2]", spec, family_size=3)     # starts the arms the first time
    status = run.finish()                                   # verdicts (Holm), reports; 0 or 1
    run.close()

Bad input raises mgpu_perf.errors.GateError (one line) when the trees are read (gate/baseline.py:
read_trees), before anything starts; a baseline whose code or Python cannot start a worker raises it
from the first compare.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mgpu_perf.errors import GateError
from mgpu_perf.gate.arm import Arm, ArmError, start_workers
from mgpu_perf.gate.baseline import Trees
from mgpu_perf.gate.compare import compare, judge
from mgpu_perf.gate.comparison import Comparison
from mgpu_perf.gate.report import gate_exit_status, write_reports
from mgpu_perf.gate.settings import Settings

__all__ = ["GateRun", "share_of_run", "with_speed_options"]


def with_speed_options(spec: dict, settings: Settings) -> dict:
    """The workload spec with the run's --ab-amp, --ab-compile and --ab-graphs, each added only when
    it is not the default: a spec without them is what an older harness or mgpu knew, and a
    baseline whose mgpu lacks an option it does name is `not comparable` (its TypeError)."""
    spec = dict(spec)
    if settings.amp != Settings.amp:
        spec.setdefault("amp", settings.amp)
    if settings.compile:
        spec.setdefault("compile", True)
    if settings.graphs != Settings.graphs:
        spec.setdefault("graphs", settings.graphs)
    return spec


def share_of_run(settings: Settings, spent_s: float, benchmarks_left: int) -> Settings:
    """The settings of the next of `benchmarks_left` benchmarks when the run has spent `spent_s`: its
    budget is --ab-budget-s, or its even share of what is left of --ab-run-budget-s, if less. A
    benchmark decided early leaves its time to the ones after it. Worker start-up and each
    benchmark's set-up count against the run (compare counts a budget from the benchmark's start).
    A smoke run, or a run budget of 0, keeps --ab-budget-s."""
    if settings.smoke or settings.run_budget_s <= 0:
        return settings
    share = max(0.0, settings.run_budget_s - spent_s) / max(1, benchmarks_left)
    return dataclasses.replace(settings, budget_s=share) if share < settings.budget_s else settings


class GateRun:
    def __init__(self, settings: Settings, trees: Trees, gpu_clocks: list | None = None):
        self.settings, self.trees = settings, trees
        self.gpu_clocks = gpu_clocks or []
        self.results: list[Comparison] = []
        self.arms: dict[str, list[Arm]] = {}  # settings.workers workers an arm
        self.versions_seen: dict = {}
        self.started = self.broken = False
        self.workdir: Path | None = None
        self.began: float | None = None  # the first compare: the run budget counts from here

    # -- arms ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Check out the baseline and start every worker of both arms; GateError if one cannot start."""
        self.started = True
        self.workdir = Path(tempfile.mkdtemp(prefix="mgpu-ab-"))
        trees = self.trees
        try:
            base_tree = trees.baseline.checkout() if trees.baseline else trees.root
        except ValueError as e:
            raise GateError(str(e)) from None
        cannot_start = {
            "baseline": f"--ab-baseline-python {trees.baseline_python} is not a Python with torch and mgpu's needs"
            if trees.baseline_python != sys.executable else
            f"the baseline's mgpu ({base_tree}) cannot be imported" if trees.require_mgpu else
            f"the baseline's worker ({base_tree}) cannot start",
            "candidate": "the candidate's worker cannot start"}
        where = {"baseline": (base_tree, trees.baseline_python), "candidate": (trees.root, sys.executable)}
        try:  # all at once; from their first answer on they work one at a time
            self.arms = start_workers(where, self.settings.workers, self.workdir, trees.require_mgpu)
        except ArmError as e:
            raise GateError(f"{cannot_start[e.label]}: {e}") from None
        self.versions_seen = {label: pool[0].versions for label, pool in self.arms.items()}  # kept if an arm dies

    def _workers(self) -> list[Arm]:
        return [arm for pool in self.arms.values() for arm in pool]

    def compare(self, name: str, spec: dict, family_size: int) -> Comparison:
        """One gated workload in both arms (arms started on first use). ArmError if an arm fails."""
        if self.broken:
            raise ArmError("a worker of an earlier benchmark failed: this run cannot go on")
        if self.began is None:
            self.began = time.perf_counter()
        if not self.started:
            try:
                self.start()
            except GateError:
                self.broken = True
                raise
        settings = self.benchmark_settings(family_size)
        try:
            result = compare(name, with_speed_options(spec, self.settings), self.arms, settings, family_size)
        except Exception:
            for arm in self._workers():  # a failed arm (or a broken exchange) leaves no state to trust
                arm.kill()
            self.arms, self.broken = {}, True
            raise
        if result.status == "undecidable" and settings.budget_s < self.settings.budget_s:
            result = dataclasses.replace(result, reason=result.reason + (
                f" (its share of --ab-run-budget-s {self.settings.run_budget_s:g}: {settings.budget_s:.0f} s)"))
        self.results.append(result)
        return result

    def benchmark_settings(self, family_size: int) -> Settings:
        """The next benchmark's settings: its share of what is left of the run's budget (share_of_run)."""
        return share_of_run(self.settings, time.perf_counter() - self.began, family_size - len(self.results))

    # -- the end ---------------------------------------------------------------------------------
    def finish(self, out_dir: Path | None) -> int:
        """Verdicts of every comparison (Holm across them), the reports (when out_dir): exit status 0 or 1."""
        self.results = judge(self.results, self.settings)
        self.written = []
        if self.results and out_dir is not None:
            self.written = write_reports(self.results, self.settings, Path(out_dir), self.trees.baseline_desc,
                                         self.trees.candidate_desc, self.versions_seen, self.gpu_clocks,
                                         self.trees.candidate_commit)
        if self.results:  # --ab-markdown FILE, and the job's summary under GitHub Actions
            from mgpu_perf.gate.markdown import write_summaries

            self.written += write_summaries(self.results, self.settings, self.trees.baseline_desc,
                                            self.trees.candidate_desc, self.trees.candidate_commit)
        return gate_exit_status(self.results, self.settings)

    def summary_lines(self) -> list[str]:
        from mgpu_perf.clocks import unlocked_warning
        from mgpu_perf.gate.report import format_table

        lines = [f"baseline:  {self.trees.baseline_desc}", f"candidate: {self.trees.candidate_desc}"]
        for label, v in self.versions_seen.items():
            lines.append(f"{label}: torch {v['torch']}, CUDA {v['cuda']}, NCCL {v['nccl']} ({v['python']})")
        warning = unlocked_warning(self.gpu_clocks)
        if warning:  # both arms run on these GPUs in turn, so drift is paired out; noise is not
            lines.append(f"WARNING: {warning}")
        lines += format_table(self.results, self.settings)
        lines += [f"wrote {path}" for path in getattr(self, "written", [])]
        return lines

    def close(self) -> None:
        for arm in self._workers():
            arm.close()
        self.arms = {}
        if self.trees.baseline is not None:
            self.trees.baseline.remove()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
