"""The counted baseline in the repository (mgpu_perf/counts/baseline.py and plugin.py): `pytest
--counts-save FILE` and `pytest --counts-check FILE` run by pytester on a tiny gated benchmark, as a user who installed
mgpu runs them: saved then checked unchanged; a commit that adds a host read a step fails naming it;
a removal fails with the command that updates the file; an entry of another torch is not comparable,
with its own exit code. The rank workloads (ddp) are counted ahead, beside the in-process ones
(mgpu_perf/counts/ahead.py): the same counts as counted in order, and a rank's failure fails its test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mgpu.errors import EXIT_NOT_COMPARABLE
from mgpu_perf.counts.ahead import in_process_first, spawns_ranks_of
from mgpu_perf.counts.baseline import describe_workload, update_command, workload_key
from mgpu_perf.counts.workload import count_workload

MODEL = '''
import torch
from torch import nn

from mgpu.spec import ModelSpec

LAYERS = 2
READS = 0


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(LAYERS))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        for _ in range(READS):
            x.sum().item()  # a read of a value by the host: a device sync a step on a GPU
        return self.head(x)


def draw(n, g):
    return torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def spec():
    return ModelSpec(build=Net, draw=draw, name="tiny")
'''

TESTS = '''
import pytest


@pytest.mark.mgpu_gate(model="model.py:spec", strategy="single", devices=1, batch=16)
def test_step(mgpu_workload):
    mgpu_workload.op()


def test_unrelated():
    raise AssertionError("a test not marked mgpu_gate ran under --counts-check")
'''

# The same tiny step in pytest's process and in 2 DDP ranks (counted ahead), listed ranks first.
RANK_TESTS = '''
import pytest


@pytest.mark.mgpu_gate(model="model.py:spec", strategy="ddp", devices=2, batch=8)
def test_ddp(mgpu_workload):
    mgpu_workload.op()


@pytest.mark.mgpu_gate(model="model.py:spec", strategy="single", devices=1, batch=8)
def test_single(mgpu_workload):
    mgpu_workload.op()
'''

FILE = "counts.json"


@pytest.fixture(scope="module", autouse=True)
def _training_modules_imported_here_first(tmp_path_factory):
    """pytester's in-process runs drop the modules they imported when they end, and torch registers
    its operator libraries once a process: one step here imports them for good (as test_plugin.py)."""
    from mgpu_perf.harness.models import ModelBench

    folder = tmp_path_factory.mktemp("warm")
    (folder / "warm_model.py").write_text(MODEL)
    session = ModelBench(f"{folder / 'warm_model.py'}:spec", "single", 1, per_device_batch=4).open()
    session.step()
    session.close()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   capture_output=True, text=True, check=True)


def _commit(repo: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (repo / name).write_text(textwrap.dedent(text))
    _git(repo, "add", *files)
    _git(repo, "commit", "-q", "-m", message)


def _run(pytester, *args):
    return pytester.runpytest_inprocess(*args, "-p", "no:cacheprovider", "-rs")


_SAVED: dict = {}  # the first saved_repo of the session, copied by the others


@pytest.fixture
def saved_repo(pytester, tmp_path_factory) -> Path:
    """A user's repository whose counted baseline was saved and committed beside its benchmark. The
    first test that asks makes it (a --counts-save run, 2 s); the others get a copy of that repository,
    .git included, each in its own pytester folder, and change only their copy."""
    repo = Path(pytester.path)
    if "repo" in _SAVED:
        shutil.copytree(_SAVED["repo"], repo, dirs_exist_ok=True)
        return repo
    _git(repo, "init", "-q")
    _commit(repo, {"model.py": MODEL, "test_speed.py": TESTS}, "a model and its gated benchmark")
    saved = _run(pytester, "--counts-save", FILE)
    assert saved.ret == 0, f"--counts-save failed: {saved.outlines[-15:]}"
    _git(repo, "add", FILE)
    _git(repo, "commit", "-q", "-m", "its counted baseline")
    kept = tmp_path_factory.mktemp("saved_repo")
    shutil.copytree(repo, kept, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    _SAVED["repo"] = kept
    return repo


def test_save_writes_an_entry_keyed_by_workload_and_environment_and_an_unchanged_tree_passes(pytester, saved_repo):
    import torch

    entries = json.loads((saved_repo / FILE).read_text())["entries"]
    assert len(entries) == 1, f"one gated benchmark, {len(entries)} entries: {[e['test'] for e in entries]}"
    entry = entries[0]
    assert entry["workload"] == {"kind": "model-step", "model": "model.py:spec", "strategy": "single", "devices": 1,
                                 "batch": 16, "amp": "off", "compile": False}, entry["workload"]
    assert entry["environment"]["torch"] == torch.__version__.split("+")[0], entry["environment"]
    assert entry["environment"]["device"] == ("cpu" if not torch.cuda.is_available() else
                                              torch.cuda.get_device_name(0)), entry["environment"]
    assert entry["counts"][0]["flops"] > 0 and entry["counts"][0]["ops"], f"nothing counted: {entry['counts']}"
    result = _run(pytester, "--counts-check", FILE)
    assert result.ret == 0, f"an unchanged tree failed its counted baseline: {result.outlines[-15:]}"
    result.assert_outcomes(passed=1, deselected=1)
    assert any(line.endswith("test_step: same") for line in result.outlines), result.outlines[-10:]


@pytest.mark.timed  # the counted check's wall time, <= 60 s
def test_a_commit_that_adds_a_host_read_a_step_fails_naming_it_within_60_s(pytester, saved_repo):
    """The issue's scenario: one commit adds a host read per step; the counted baseline fails it."""
    baseline_reads = json.loads((saved_repo / FILE).read_text())["entries"][0]["counts"][0]["host_reads"]
    _commit(saved_repo, {"model.py": MODEL.replace("READS = 0", "READS = 1")}, "a host read a step")
    began = time.perf_counter()
    result = _run(pytester, "--counts-check", FILE)
    seconds = time.perf_counter() - began
    text = result.stdout.str()
    assert result.ret == 1, f"a host read a step passed the counted baseline (exit {result.ret}): {text[-1500:]}"
    expected = f"host reads {baseline_reads} → {baseline_reads + 1} a step"
    assert f"slower (counted): {expected}" in text, f"the failure does not name {expected!r}: {text[-1500:]}"
    assert seconds <= 60, f"the counted check took {seconds:.0f} s, over the 60 s it is meant to take"


def test_a_guarded_count_that_fell_fails_with_the_command_that_updates_the_file(pytester, saved_repo):
    _commit(saved_repo, {"model.py": MODEL.replace("LAYERS = 2", "LAYERS = 1")}, "one layer fewer")
    result = _run(pytester, "--counts-check", FILE)
    text = result.stdout.str()
    assert result.ret == 1, f"a step doing less passed the ratchet (exit {result.ret}): {text[-1500:]}"
    assert "fewer (counted): FLOPs -" in text, f"the fall in FLOPs is not named: {text[-1500:]}"
    assert f"--counts-save {FILE}" in text and "python -m pytest" in text, f"no update command: {text[-1500:]}"
    updated = _run(pytester, "--counts-save", FILE)  # the update, then the check passes
    assert updated.ret == 0 and _run(pytester, "--counts-check", FILE).ret == 0, "the update did not ratchet the file"


def test_an_entry_of_another_torch_is_not_comparable_with_its_own_exit_code(pytester, saved_repo):
    data = json.loads((saved_repo / FILE).read_text())
    data["entries"][0]["environment"]["torch"] = "1.13.1"
    (saved_repo / FILE).write_text(json.dumps(data))
    result = _run(pytester, "--counts-check", FILE)
    text = result.stdout.str()
    assert result.ret == EXIT_NOT_COMPARABLE, f"exit {result.ret}, not {EXIT_NOT_COMPARABLE}: {text[-1500:]}"
    assert "not comparable: recorded under torch 1.13.1 on" in text and "NOT COMPARABLE" in text, text[-1500:]
    assert f"--counts-save {FILE}" in text, f"no update command: {text[-1500:]}"
    strict = _run(pytester, "--counts-check", FILE, "--counts-strict")
    assert strict.ret == 1, f"not comparable under --counts-strict: exit {strict.ret}, not a failure"


def test_a_gated_benchmark_without_an_entry_is_said_and_fails_under_strict(pytester, saved_repo):
    (saved_repo / "test_more.py").write_text(TESTS.replace("batch=16", "batch=8").replace("test_unrelated",
                                                                                        "test_unrelated_too"))
    result = _run(pytester, "--counts-check", FILE)
    assert result.ret == 0, f"a benchmark with no entry failed without --counts-strict: {result.outlines[-10:]}"
    assert "no entry for model.py:spec single x1 batch 8" in result.stdout.str(), result.outlines[-10:]
    assert _run(pytester, "--counts-check", FILE, "--counts-strict").ret == 1, "no entry passed under --counts-strict"


def _counted_here(workload: dict, repo: Path) -> list[dict]:
    """The workload counted in order, from this test's thread; the user's model it imported is
    dropped after, as pytester's runs drop theirs, so that the next run imports the file as it is then."""
    before = set(sys.modules)
    try:
        return count_workload(dict(workload), repo)
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("mgpu_user_"):
                del sys.modules[name]


def test_rank_workloads_counted_ahead_count_what_they_count_in_order_and_a_host_read_fails_in_the_ranks(pytester):
    repo = Path(pytester.path)
    _git(repo, "init", "-q")
    _commit(repo, {"model.py": MODEL, "test_speed.py": RANK_TESTS}, "a model stepped in pytest's process and in ranks")
    saved = _run(pytester, "--counts-save", FILE, "-v")
    assert saved.ret == 0, f"--counts-save failed: {saved.outlines[-15:]}"
    ran = [line.split(" ")[0] for line in saved.outlines if line.startswith("test_speed.py::") and "PASSED" in line]
    assert ran == ["test_speed.py::test_single", "test_speed.py::test_ddp"], f"not in-process first: {ran}"
    entry = next(e for e in json.loads((repo / FILE).read_text())["entries"] if e["workload"]["strategy"] == "ddp")
    in_order = _counted_here(entry["workload"], repo)
    assert entry["counts"] == in_order, "the ranks counted ahead differ from the ranks counted in order: " + str(
        [(rank, k) for rank, (a, b) in enumerate(zip(entry["counts"], in_order)) for k in a if a[k] != b.get(k)])
    reads = [rank["host_reads"] for rank in entry["counts"]]
    _commit(repo, {"model.py": MODEL.replace("READS = 0", "READS = 1")}, "a host read a step")
    text = _run(pytester, "--counts-check", FILE).stdout.str()
    assert f"rank 0: host reads {reads[0]} → {reads[0] + 1} a step" in text, f"ddp's read not named: {text[-1500:]}"
    assert "2 failed" in text, f"the host read did not fail both benchmarks: {text[-800:]}"


def test_a_rank_that_fails_while_counted_ahead_fails_its_test_and_the_rest_run(pytester):
    failing = MODEL.replace("    def forward(self, x):\n", "    def forward(self, x):\n"
                            "        if torch.distributed.is_initialized():\n"
                            "            raise RuntimeError('a forward that fails in the ranks')\n")
    (Path(pytester.path) / "model.py").write_text(failing)
    (Path(pytester.path) / "test_speed.py").write_text(RANK_TESTS)
    (Path(pytester.path) / FILE).write_text('{"format": 1, "entries": []}')
    result = _run(pytester, "--counts-check", FILE)
    text = result.stdout.str()
    assert result.ret == 1, f"a rank's failure did not fail the run (exit {result.ret}): {text[-1500:]}"
    result.assert_outcomes(failed=1, skipped=1)  # single: counted, no entry
    assert "RuntimeError: a forward that fails in the ranks" in text, f"the rank's error is not said: {text[-1500:]}"


def test_only_the_workloads_whose_steps_run_in_ranks_are_counted_ahead_and_they_run_last():
    specs = {"a": {"kind": "model-step", "strategy": "ddp", "devices": 2}, "b": {"kind": "matmul"},
             "c": {"kind": "train-step", "strategy": "fsdp", "devices": 2},
             "d": {"kind": "train-step", "strategy": "manual", "devices": 2},
             "e": {"kind": "train-step", "strategy": "no-such-strategy"}}
    ahead = {n for n, spec in specs.items() if spawns_ranks_of(spec)}
    assert ahead == {"a", "c"}, f"counted ahead: {sorted(ahead)}, not ddp's and fsdp's"

    class Item:
        def __init__(self, nodeid):
            self.nodeid = nodeid

    order = [i.nodeid for i in in_process_first([Item(n) for n in "abcde"], ahead)]
    assert order == ["b", "d", "e", "a", "c"], f"in-process first, each lane in its order: {order}"


@pytest.mark.parametrize("args, message", [
    (["--counts-save", "a.json", "--counts-check", "b.json"], "one at a time"),
    (["--counts-check", "missing.json"], "no such file"),
    (["--counts-check", FILE, "--ab-baseline-python", sys.executable], "one at a time"),
])
def test_bad_counts_options_are_a_usage_error(pytester, args, message):
    (Path(pytester.path) / FILE).write_text('{"format": 1, "entries": []}')
    result = _run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, f"{args}: exit {result.ret}"
    assert message in result.stderr.str(), f"{args}: {result.stderr.str()[-500:]}"


def test_the_workload_key_leaves_out_what_follows_the_core_count():
    mine = {"kind": "train-step", "strategy": "ddp", "devices": 2, "batch": 32, "width": 16, "threads_per_device": 1}
    other = {**mine, "threads_per_device": 4, "graphs": "off"}
    assert workload_key(mine) == workload_key(other), "the key follows this machine's cores"
    assert workload_key({**mine, "compile": True}) != workload_key(mine), "compile is not part of the key"
    assert describe_workload(workload_key(mine)) == "train-step ddp x2 batch 32 (width=16)"


def test_the_update_command_turns_the_check_into_a_save():
    assert update_command(["perf", "--devices", "2", "--counts-check", "perf/c.json", "-q"], "perf/c.json") == \
        "python -m pytest perf --devices 2 -q --counts-save perf/c.json"
    assert re.search(r"--counts-save x$", update_command(["--counts-check=x"], "x"))


def test_the_workflow_runs_the_counted_check_on_every_pull_request():
    import yaml

    root = Path(__file__).resolve().parents[1]
    workflow = yaml.safe_load((root / ".github" / "workflows" / "counted-baseline.yml").read_text())
    triggers = workflow.get(True, workflow.get("on"))  # YAML 1.1 reads a bare `on:` as True
    assert "pull_request" in triggers, f"the counted baseline does not run on pull requests: {triggers}"
    runs = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert "make counts-check" in runs, f"no step runs `make counts-check`: {runs}"
    makefile = (root / "Makefile").read_text()
    target = makefile[makefile.index("\ncounts-check:"):].split("\n\n")[0]
    assert "--counts-check $(COUNTS_FILE)" in target and "COUNTS_FILE ?= perf/counts-cpu.json" in makefile, target
    assert (root / "perf" / "counts-cpu.json").is_file(), "the committed baseline perf/counts-cpu.json is missing"
