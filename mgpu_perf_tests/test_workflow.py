"""The GPU workflow (.github/workflows/gpu-regression.yml), rehearsed where CI runs: no GPU runner has
ever run it, so a renamed option, a missing make target or a wrong path would first show there.

    pytest mgpu_perf_tests/test_workflow.py

A fresh clone of this repository's committed HEAD (its `.venv` is this one's, so nothing is
installed) runs the
workflow's `run:` steps as GitHub Actions would, `${{ ... }}` filled in and each step's `if:`
obeyed, for both events:

- a pull request: the install, correctness on the GPUs (collected only: its tests run in
  `make test`, and need GPUs here), and
  the A/B gate against the merge base, which is the previous commit, as a smoke run
  (`--benchmark-disable` through PYTEST_ADDOPTS: every gated workload in both arms, three rounds);
- a push to main: the timing step twice on one benchmark (`-k`), as two pushes would store and
  compare: the first run on a runner has no history and must not ask to compare; the second
  compares with the first run's stored file.

The `uses:` steps (checkout, cache, artifact) are GitHub's: their paths are checked against the
folders the `run:` steps write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mgpu_perf.gated import gated_set
from mgpu_perf.sweep import make_sweep

yaml = pytest.importorskip("yaml", reason="reads the workflow file with PyYAML (pyyaml, in the test extras)")

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-regression.yml"
RUNNER = "rehearsal"

pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD~1"], capture_output=True).returncode != 0,
    reason="needs a git checkout with a previous commit (the pull request's merge base)")


def _job(tree: Path = ROOT) -> dict:
    return yaml.safe_load((tree / WORKFLOW.relative_to(ROOT)).read_text())["jobs"]["gpu"]


def expand(text: str, context: dict) -> str:
    """`${{ name }}` filled in from context (what GitHub allows in a step's `run:`); an expression
    the rehearsal does not know fails it."""
    def value(match):
        name = match.group(1).strip()
        if name not in context:
            raise AssertionError(f"the rehearsal cannot fill in ${{{{ {name} }}}}: add it to the context")
        return context[name]
    return re.sub(r"\$\{\{(.*?)\}\}", value, text)


def runs(step: dict, event: str) -> bool:
    """A step's `if:` for this event (the forms this workflow uses)."""
    condition = step.get("if")
    if condition is None:
        return True
    known = {"always()": True, "github.event_name == 'pull_request'": event == "pull_request",
             "github.event_name != 'pull_request'": event != "pull_request"}
    assert condition in known, f"the rehearsal does not know the condition {condition!r}"
    return known[condition]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone whose origin/main is the previous commit (a pull request's base), this
    checkout's .venv in it, and pyproject.toml no newer than that .venv's install stamp (so the
    install step finds it up to date instead of installing the clone over this checkout)."""
    venv = Path(sys.prefix)
    stamp = venv / ".installed"
    if sys.prefix == sys.base_prefix or not stamp.exists():
        # Its install step would then run `python -m venv` and `pip install -e` on this Python.
        pytest.skip("needs the Makefile's .venv (make test sets it up): the clone borrows it, installing nothing")
    tree = tmp_path_factory.mktemp("workflow") / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tree)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(tree), "update-ref", "refs/remotes/origin/main", "HEAD~1"], check=True)
    (tree / ".venv").symlink_to(venv, target_is_directory=True)
    os.utime(tree / "pyproject.toml", (stamp.stat().st_mtime - 1,) * 2)
    up_to_date = subprocess.run(["make", "-q", ".venv/.installed"], cwd=tree, capture_output=True)
    assert up_to_date.returncode == 0, "the clone's install step would install: refusing to run it over this .venv"
    return tree


def run_steps(tree: Path, event: str, extra_env: dict | None = None, only: str | None = None,
              step_env: dict[str, dict] | None = None) -> list[tuple[str, str]]:
    """Run the job's `run:` steps for this event in `tree` (bash -e, as Actions runs them); return
    (step name, output) of each. A failing step fails the test with its output. `step_env`: more
    variables for the steps whose name holds a key."""
    job = _job(tree)  # the clone's own workflow: what its commit holds
    sha = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    context = {"runner.name": RUNNER, "github.base_ref": "main", "github.sha": sha, "github.event_name": event}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["RUNNER_NAME"] = RUNNER  # set by every Actions runner
    # A job's env may not read the runner context (GitHub rejects the file): github.* only.
    job_context = {k: v for k, v in context.items() if k.startswith("github.")}
    env.update({name: expand(str(value), job_context) for name, value in job.get("env", {}).items()})
    env.update(extra_env or {})
    done = []
    for step in job["steps"]:
        if "run" not in step or not runs(step, event) or (only and only not in step.get("name", "")):
            continue
        env_here = dict(env, **next((v for k, v in (step_env or {}).items() if k in step.get("name", "")), {}))
        proc = subprocess.Popen(["bash", "-e", "-c", expand(step["run"], context)], cwd=tree, env=env_here,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=400)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the step's pytest, its gate workers and their ranks
            stdout, stderr = proc.communicate()
            raise AssertionError(f"step {step.get('name')!r} ran over 400 s:\n{stdout[-3000:]}\n{stderr[-2000:]}")
        assert proc.returncode == 0, f"step {step.get('name')!r} failed (exit {proc.returncode}):\n" \
                                     f"{stdout[-3000:]}\n{stderr[-2000:]}"
        done.append((step["name"], stdout + stderr))
    return done


def test_the_workflow_runs_what_this_repository_has():
    job = _job()
    names = [step.get("name", step.get("uses")) for step in job["steps"]]
    assert any("A/B gate" in name for name in names) and any("Restore" in name for name in names), names
    assert "runner." not in json.dumps(job.get("env", {})), "a job's env cannot read the runner context"
    cached = [step["with"]["path"] for step in job["steps"] if str(step.get("uses", "")).startswith("actions/cache")]
    timing = next(step["run"] for step in job["steps"] if "compare with the last stored run" in step.get("name", ""))
    assert cached and all(path == ".benchmarks/${{ runner.name }}" for path in cached), cached
    assert 'STORAGE=".benchmarks/$RUNNER_NAME"' in timing, "the runs must store where the cache steps keep"
    uploaded = [step["with"]["path"] for step in job["steps"] if str(step.get("uses", "")).startswith("actions/upload")]
    assert uploaded == ["perf-results/"], uploaded
    restore = names.index("Restore the stored runs (main)")
    assert restore < next(i for i, n in enumerate(names) if "compare with the last stored run" in n), \
        "the history must be restored before the benchmarks are compared with it"


# The perf steps' pytest runs use no hypothesis, whose pytest plugin imports it at the end of every
# run anyway (about 1 s of each run here): the rehearsal leaves the plugin out of them.
NO_HYPOTHESIS = "-p no:hypothesispytest"


# One quick benchmark: what the push rehearsal checks is where the runs are stored and what they compare with.
ONE_BENCHMARK = {"PYTEST_ADDOPTS": f"-k 'test_split_batch and 16KiB' {NO_HYPOTHESIS}"}


def two_pushes(tree: Path) -> tuple[str, list[Path], str, list[Path]]:
    """The timing step as two pushes run it: (first's output, stored files after it, second's
    output, stored files after it)."""
    storage = tree / ".benchmarks" / RUNNER
    shutil.rmtree(storage, ignore_errors=True)
    first = run_steps(tree, "push", ONE_BENCHMARK, only="Time every benchmark")[0][1]
    after_first = sorted(storage.glob("*/*.json"))
    second = run_steps(tree, "push", ONE_BENCHMARK, only="Time every benchmark")[0][1]
    return first, after_first, second, sorted(storage.glob("*/*.json"))


@pytest.fixture(scope="module")
def pushes(clone):
    """The two pushes' rehearsal, started beside the pull request's: mostly single-threaded process
    starts, it fills the core the pull request's leaves idle. They share the clone's checkout and
    nothing they write (the pushes: `.benchmarks/`, `perf-results/benchmark.json`; the pull request:
    `perf-results/ab*.json`), and neither judges a timing."""
    with ThreadPoolExecutor(1, thread_name_prefix="push-rehearsal") as pool:
        yield pool.submit(two_pushes, clone)


@pytest.mark.slow  # about 40 s with the pushes beside it: `make test-slow` (CI's time)
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_pull_request_runs_the_gate_against_its_merge_base(clone, pushes):
    # The correctness step is collected only: its commands, paths and marker expression are what
    # could break here; its tests run in `make test`, and its GPU tests skip on this machine.
    done = run_steps(clone, "pull_request", {"PYTEST_ADDOPTS": f"--benchmark-disable {NO_HYPOTHESIS}"},
                     step_env={"Correctness": {"PYTEST_ADDOPTS": "--collect-only"},
                               "A training script": {"PYTEST_ADDOPTS": "--collect-only"}})
    assert [name for name, _ in done] == ["Install (.venv with mgpu and its test extras)", "Correctness on the GPUs",
                                          "A training script checked at 1 and 2 ranks (check-script)",
                                          "A/B gate against the merge base (pull requests)"], done
    assert "1 test collected" in done[2][1] or "1/" in done[2][1], done[2][1][-2000:]  # it runs in examples/test_loops.py
    selected = {line.split("::")[0] for line in done[1][1].splitlines() if line.startswith("correctness/")}
    everything = {f"correctness/{p.name}" for p in (clone / "correctness").glob("test_*.py")}
    assert selected == everything, f"the correctness step runs the whole folder; missing: {sorted(everything - selected)}"
    assert "tests collected" in done[1][1], done[1][1][-2000:]
    gate = done[-1][1]
    assert "mgpu A/B gate" in gate and "SMOKE RUN" in gate, gate[-3000:]
    report = json.loads((clone / "perf-results" / "ab.json").read_text())
    base = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD~1"], capture_output=True, text=True).stdout.strip()
    assert report["baseline"].startswith(base), f"the baseline was {report['baseline']}, not the merge base {base}"
    names = sorted(b["name"].split("::")[-1] for b in report["benchmarks"])
    assert names == sorted(name for name, _ in gated_set(make_sweep(None))), f"the gate ran {names}"
    for b in report["benchmarks"]:
        # The previous commit may lack what a new workload needs: `not comparable` is its verdict then.
        assert b["status"] in ("compared", "not comparable"), b
        if b["status"] == "compared":
            assert b["rounds"] == 3 and len(b["samples"]["baseline"]) == len(b["samples"]["candidate"]) == 3, b
            assert all(t > 0 for t in b["samples"]["baseline"] + b["samples"]["candidate"]), b
    assert sum(b["status"] == "compared" for b in report["benchmarks"]) >= len(names) - 1, report
    compare = subprocess.run([str(Path(sys.executable).with_name("pytest-benchmark")), "compare",
                              str(clone / "perf-results" / "ab-baseline.json"),
                              str(clone / "perf-results" / "ab-candidate.json")],
                             # Not in this checkout: pytest-benchmark's command loads ./conftest.py, which imports torch.
                             cwd=clone / "perf-results", capture_output=True, text=True, timeout=60)
    assert compare.returncode == 0 and "test_train_step" in compare.stdout, compare.stdout + compare.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pushes_to_main_store_their_timings_and_compare_with_the_last_stored_run(clone, pushes):
    first, stored, second, stored_after_second = pushes.result(timeout=280)
    assert len(stored) == 1, f"the first push stored {stored}"
    assert "Comparing against" not in first and "Can't compare" not in first, first[-2000:]
    assert json.loads((clone / "perf-results" / "benchmark.json").read_text())["benchmarks"], "no benchmark.json"
    assert len(stored_after_second) == 2, f"the second push did not store its run: {stored_after_second}"
    assert "Comparing against benchmarks from" in second and stored[0].name in second, \
        "the second push did not compare with the first's stored run:\n" + second[-3000:]
