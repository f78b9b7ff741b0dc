"""A counted baseline in the repository: each gated benchmark's counted step (mgpu_perf/counting.py)
kept in a JSON file beside the code, and the working tree checked against it with no second arm.

    pytest perf --devices 2 --counts-save perf/counts-cpu.json     # write (or update) the file
    pytest perf --devices 2 --counts-check perf/counts-cpu.json    # the step of each gated benchmark, counted

Registered by the plugin (plugin.py) when --counts-save or --counts-check is given. Only the tests
marked `mgpu_gate` run, and their bodies do not: each marker's workload is built in this process,
stepped twice (the warm-up), and one more step is counted, as a gate worker counts it. Nothing is
timed and no baseline is checked out. The workloads whose steps run in rank processes (ddp, fsdp)
are counted ahead, beside the in-process ones, on a CPU (counts_ahead.py): their counts are the
ranks' own, the same either way.

An entry is keyed by the workload (`workload_key`: the marker's spec with the fields that follow this
machine's core count left out, and amp and compile always said) and by what fixes the counts
(`environment`: torch's version, and on a GPU the CUDA and cuDNN versions and the device's name).
The check, benchmark by benchmark, against the entry of the same workload and environment:

* a guarded count (counting.compare_counts: host reads, collectives, FLOPs, bytes, ...) that grew:
  `slower (counted)`, a failure naming it as the gate does (`host reads 1 → 2 a step`);
* a guarded count that fell: `fewer (counted)`, a failure too, with the command that updates the
  file (a ratchet: the file keeps the best the code has done);
* op counts, CUDA kernels and peak memory: reported, never failed;
* an entry of the workload recorded under another environment only: `not comparable`, said with
  both environments and the update command; the run exits NOT_COMPARABLE_EXIT (a failure under
  --counts-strict), never 0;
* no entry of the workload at all: `no entry`, said (a failure under --counts-strict).
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mgpu.errors import EXIT_NOT_COMPARABLE
from mgpu_perf.counts_ahead import CountsAhead, can_count_ahead, in_process_first, spawns_ranks_of
from mgpu_perf.markers import keep_gated

__all__ = ["NOT_COMPARABLE_EXIT", "PLUGIN", "CountsBaseline", "workload_key", "describe_workload", "environment",
           "Checked", "check_entry", "merge_entries", "count_workload", "count_built"]

PLUGIN = "mgpu-counts-baseline"  # plugin.COUNTS_PLUGIN
FORMAT = 1
NOT_COMPARABLE_EXIT = EXIT_NOT_COMPARABLE  # mgpu.errors' table
# Plain steps before the counted one, as a gate worker takes them: optimizer state made, caches warm,
# and DDP's buckets rebuilt (in its second step: counted after one warm-up step, ddp's step has 2
# broadcasts and 2.8 MB allocated more than every later step).
WARMUP_OPS = 2
# Spec fields that follow this machine's cores (a CPU strategy's share of them) or how a step is timed
# (CUDA graphs: the counted step is the plain one either way): not part of what a step does.
NOT_KEYS = ("threads_per_device", "threads", "graphs")


def workload_key(spec: dict) -> dict:
    """What a step is: the marker's workload spec without NOT_KEYS, amp and compile always said."""
    key = {k: v for k, v in spec.items() if k not in NOT_KEYS}
    key.setdefault("amp", "off")
    key["compile"] = bool(key.get("compile", False))
    return dict(sorted(key.items()))


def describe_workload(key: dict) -> str:
    """One line: `model.py:spec single x1 batch 32` or `train-step ddp x2 batch 32 (width=16, ...)`."""
    first = key.get("model") or key.get("kind", "?")
    main = [first] + ([f"{key['strategy']} x{key.get('devices', 1)}"] if "strategy" in key else []) \
        + ([f"batch {key['batch']}"] if "batch" in key else [])
    rest = [f"{k}={v}" for k, v in key.items() if k not in ("model", "kind", "strategy", "devices", "batch", "amp",
                                                          "compile")]
    options = [f"amp {key['amp']}"] if key.get("amp", "off") != "off" else []
    options += ["compile"] if key.get("compile") else []
    return " ".join(main + options) + (f" ({', '.join(rest)})" if rest else "")


def environment() -> dict:
    """What fixes the counts besides the code: torch's version (its local build label, +cpu or +cu130,
    left out: one torch runs the same ops on a CPU whichever wheel it came in) and the device kind;
    on a GPU also CUDA's and cuDNN's versions, which choose its kernels. `torch_build`: the whole
    version string, recorded, not compared."""
    import torch

    gpu = torch.cuda.is_available()
    env = {"torch": torch.__version__.split("+")[0], "device": torch.cuda.get_device_name(0) if gpu else "cpu",
           "cuda": torch.version.cuda if gpu else None,
           "cudnn": torch.backends.cudnn.version() if gpu and torch.backends.cudnn.is_available() else None,
           "torch_build": torch.__version__}
    return env


def describe_environment(env: dict) -> str:
    parts = [f"torch {env.get('torch')}", f"on {env.get('device')}"]
    if env.get("cuda"):
        parts.append(f"CUDA {env['cuda']}, cuDNN {env.get('cudnn')}")
    return " ".join(parts)


def count_built(spec: dict) -> list[dict]:
    """The counted step of a gated workload built here, in the current folder: WARMUP_OPS plain
    steps, then one counted (each rank's counts); the workload's own check (finite losses, weights
    moved) after it."""
    from mgpu_perf.harness.workloads import make_gated

    workload = make_gated(spec)
    try:
        for _ in range(WARMUP_OPS):
            workload.op()
        counts = workload.count(collect_garbage=False)  # nothing is timed after it
        workload.check()
        return counts
    finally:
        workload.close()


def count_workload(spec: dict, root: Path) -> list[dict]:
    """count_built from `root` (where a model's relative path starts). The thread count is given
    back after, so that the next workload does not inherit one set by this one."""
    import torch

    threads, cwd = torch.get_num_threads(), os.getcwd()
    os.chdir(root)
    try:
        return count_built(spec)
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Checked:
    status: str                                        # same | changed | slower (counted) | fewer (counted) |
    increases: list = field(default_factory=list)      #   not comparable | no entry
    decreases: list = field(default_factory=list)      # guarded counts that fell (the ratchet)
    reported: list = field(default_factory=list)       # op counts, kernels, peak memory
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("slower (counted)", "fewer (counted)")


def _same_env(a: dict, b: dict) -> bool:
    return all(a.get(k) == b.get(k) for k in ("torch", "device", "cuda", "cudnn"))


def check_entry(entries: list[dict], key: dict, env: dict, counts: list[dict]) -> Checked:
    """The counted step `counts` (each rank's) against the file's entry of the same workload and
    environment: see the module's docstring for each status."""
    from mgpu_perf.counting import StepCounts, compare_counts

    mine = [e for e in entries if e["workload"] == key]
    entry = next((e for e in mine if _same_env(e["environment"], env)), None)
    if entry is None:
        if not mine:
            return Checked("no entry", reason=f"no entry for {describe_workload(key)}")
        recorded = "; ".join(sorted({describe_environment(e["environment"]) for e in mine}))
        return Checked("not comparable", reason=f"recorded under {recorded}, this run is {describe_environment(env)}")
    if len(entry["counts"]) != len(counts):
        return Checked("not comparable", reason=f"{len(entry['counts'])} ranks recorded, {len(counts)} counted")
    increases, decreases, reported, said = [], [], [], set()
    for rank, (before, now) in enumerate(zip(entry["counts"], counts)):
        where = f"rank {rank}: " if len(counts) > 1 else ""
        for change in compare_counts(StepCounts.from_dict(before), StepCounts.from_dict(now)):
            if change.text in said:
                continue  # the same change in another rank: said once
            said.add(change.text)
            (increases if change.slower else decreases if change.guarded else reported).append(where + change.text)
    status = ("slower (counted)" if increases else "fewer (counted)" if decreases else
              "changed" if reported else "same")
    return Checked(status, increases, decreases, reported)


def merge_entries(old: list[dict], new: list[dict]) -> list[dict]:
    """The file's entries after a save: each new one replaces the old entry of its workload on the
    same device kind (whatever its versions: the update moves that baseline on); entries of other
    device kinds stay. Sorted, so that the file's diff shows what changed."""
    def slot(e):
        return json.dumps(e["workload"], sort_keys=True), e["environment"].get("device")

    kept = {slot(e): e for e in old}
    kept.update({slot(e): e for e in new})
    return [kept[s] for s in sorted(kept)]


def read_file(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path}: not a counts file of format {FORMAT} (written by pytest --counts-save)")
    return data["entries"]


def write_file(path: Path, entries: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "written_by": "pytest --counts-save (mgpu_perf/baseline_counts.py)",
            "entries": entries}
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def update_command(args: list[str], path: str) -> str:
    """The invocation with --counts-check FILE turned into --counts-save FILE: what updates the file."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--counts-check":
            skip = True
            continue
        if arg.startswith("--counts-check="):
            continue
        out.append(arg)
    return shlex.join(["python", "-m", "pytest", *out, "--counts-save", path])


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
        if checked.status == "slower (counted)":
            pytest.fail("slower (counted): " + "; ".join(checked.increases), pytrace=False)
        if checked.status == "fewer (counted)":
            pytest.fail("fewer (counted): " + "; ".join(checked.decreases) + f" (the step does less than "
                        f"{self.path} says: update it, and commit it, with: {self.update})", pytrace=False)
        if checked.status in ("not comparable", "no entry"):
            message = f"{checked.status}: {checked.reason}" + (
                f" (update the file with: {self.update})" if checked.status == "not comparable" else "")
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
        elif session.exitstatus == 0 and any(c.status == "not comparable" for c in self.results.values()):
            session.exitstatus = NOT_COMPARABLE_EXIT

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
        if "not comparable" in statuses:
            tr.write_line(f"NOT COMPARABLE: an entry of {self.path} was recorded under another torch or device; "
                          f"nothing was checked for it (exit {NOT_COMPARABLE_EXIT}). Update the file with: "
                          f"{self.update}", red=True, bold=True)
        if "fewer (counted)" in statuses:
            tr.write_line(f"a guarded count fell: the file is a ratchet; update it with: {self.update}", yellow=True)


def register(config, save: str | None, check: str | None, strict: bool) -> None:
    """The plugin's entry (plugin.py): a UsageError on bad options, before anything runs."""
    config.pluginmanager.register(CountsBaseline(config, save, check, strict), PLUGIN)

