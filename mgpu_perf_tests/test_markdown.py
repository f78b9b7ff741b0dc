"""The gate's Markdown summary (mgpu_perf/gate/markdown.py) and the workflow that posts it on a pull
request (.github/workflows/gpu-regression.yml): the summary's content from a gate run made here
(rounds given, judged as the gate judges them), the files it goes to (--ab-markdown, the job
summary), the candidate's commit in ab.json, and the workflow's steps read from its YAML. The
posting itself runs only on GitHub.

    pytest mgpu_perf_tests/test_markdown.py
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.compare import judge
from mgpu_perf.gate.comparison import Comparison
from mgpu_perf.gate.counted import Counted
from mgpu_perf.gate.markdown import MARKER, STEP_SUMMARY_ENV, summary_markdown
from mgpu_perf.gate.baseline import read_trees
from mgpu_perf.gate.run import GateRun
from mgpu_perf.gate.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu-regression.yml"


def _timed(name: str, ratio: float, rounds: int = 40, counted: Counted | None = None) -> Comparison:
    """A compared benchmark whose candidate takes `ratio` times the baseline's time, with a little
    alternating noise (so the interval has a width)."""
    base = [0.100 * (1.01 if i % 2 else 0.99) for i in range(rounds)]
    cand = [b * ratio * (0.995 if i % 3 else 1.005) for i, b in enumerate(base)]
    return Comparison(name, {"kind": "x"}, samples={"baseline": base, "candidate": cand}, pairs=[0] * rounds,
                      estimate=abstats.estimate(base, cand, Settings.threshold), counted=counted or Counted())


HOST_READ = "host reads 1 → 2 a step"
OPS_ONLY = "aten::detach 15 → 19 a step"


def gate_results(settings: Settings) -> list[Comparison]:
    """A run of four: 30 % slower with a guarded count up, unchanged with op counts changed only,
    unchanged and counted the same, and one the baseline cannot set up."""
    results = [_timed("test_speed.py::test_step[ddp-2]", 1.30,
                      counted=Counted("slower (counted)", [HOST_READ, OPS_ONLY], [HOST_READ])),
               _timed("test_speed.py::test_step[single-1]", 1.0, counted=Counted("changed", [OPS_ONLY], [])),
               _timed("test_speed.py::test_matmul", 1.0, counted=Counted("same")),
               Comparison("test_speed.py::test_new", {"kind": "x"}, status="not comparable",
                          reason="the baseline cannot run it: no module named 'model' | or model.py")]
    return judge(results, settings)


def _row(text: str, name: str) -> list[str]:
    row = next((line for line in text.splitlines() if line.startswith(f"| `{name}`")), None)
    assert row is not None, f"no row for {name} in:\n{text}"
    return [cell.strip() for cell in row.strip("|").split(" | ")]


def test_the_summary_holds_each_benchmarks_timed_and_counted_verdicts_and_the_candidates_commit():
    settings = Settings()
    commit = "0123456789abcdef0123456789abcdef01234567"
    results = gate_results(settings)
    text = summary_markdown(results, settings, "origin/main (89abcdef0123)",
                            "the working tree of /repo (no uncommitted changes)", commit)
    assert text.startswith(MARKER + "\n### mgpu A/B gate: fails"), text
    assert f"candidate: commit `{commit}`" in text and "baseline: origin/main (89abcdef0123)" in text, text
    slower = _row(text, "test_step[ddp-2]")
    ratio = results[0].estimate.ratio
    assert slower[1] == "**slower**" and slower[2] == f"{ratio:.3f}" and slower[4] == "40", slower
    low, high = map(float, slower[3].split("-"))
    assert 1.25 < low < ratio < high < 1.35, f"the interval of a ratio about 1.30: {slower[3]}"
    assert slower[5] == f"**slower (counted)**: {HOST_READ}", f"only the guarded count, failed: {slower[5]}"
    changed = _row(text, "test_step[single-1]")
    assert changed[1] == "unchanged" and changed[5] == f"changed (reported, not failed): {OPS_ONLY}", changed
    assert _row(text, "test_matmul")[5] == "same step", _row(text, "test_matmul")
    new = _row(text, "test_new")
    assert new[1:5] == ["not comparable", "-", "-", "-"], new
    assert "- `test_new`: not comparable: the baseline cannot run it: no module named 'model' \\| or model.py" in text, \
        "a reason's pipe must not split its row's cells:\n" + text
    assert "threshold 10%: `slower` = interval above 1.050" in text, text


def test_a_run_that_passes_and_a_smoke_run_say_so_in_the_headline():
    settings = Settings()
    passing = judge([_timed("t::a", 1.0, counted=Counted("same")), _timed("t::b", 0.7)], settings)
    text = summary_markdown(passing, settings, "HEAD~1 (abc)", "the working tree", None)
    assert "### mgpu A/B gate: passes (1 unchanged, 1 faster)" in text and "commit `" not in text, text
    smoke = Settings(smoke=True)
    assert "SMOKE RUN, verdicts mean nothing" in summary_markdown(judge([_timed("t::a", 2.0)], smoke), smoke, "b", "c", None)
    report_only = Settings(counts="report")
    only_counted = judge([_timed("t::a", 1.0, counted=Counted("slower (counted)", [HOST_READ], [HOST_READ]))], report_only)
    assert "gate: passes (1 unchanged, 1 slower (counted))" in summary_markdown(only_counted, report_only, "b", "c", None)


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "one"]):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    return repo, head.stdout.strip()


def test_a_gate_run_writes_its_summary_and_the_job_summary_and_records_the_candidates_commit(tmp_path, monkeypatch):
    """GateRun.finish as a run ends (its benchmarks' rounds given here, no workers): --ab-markdown
    FILE replaced, $GITHUB_STEP_SUMMARY appended to (two runs: two summaries), and the candidate's
    commit in ab.json and in ab-candidate.json's commit_info."""
    repo, head = _repo(tmp_path)
    job_summary = tmp_path / "step-summary.md"
    job_summary.write_text("earlier step\n")
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(job_summary))
    markdown = tmp_path / "out" / "gate.md"
    for attempt in range(2):
        run = GateRun(Settings.from_values({"markdown": str(markdown)}), read_trees(repo, "HEAD"))
        run.results = [_timed("test_speed.py::test_step", 1.0)]
        assert run.finish(tmp_path / "ab") == 0
        assert markdown in run.written and job_summary in run.written, run.written
    text = markdown.read_text()
    assert text.count(MARKER) == 1 and f"commit `{head}`" in text and "| `test_step` | unchanged |" in text, text
    appended = job_summary.read_text()
    assert appended.startswith("earlier step\n") and appended.count(MARKER) == 2, appended
    assert json.loads((tmp_path / "ab" / "ab.json").read_text())["candidate_commit"] == head
    assert json.loads((tmp_path / "ab" / "ab-candidate.json").read_text())["commit_info"] == {"id": head}


def test_without_markdown_or_a_job_summary_nothing_more_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(STEP_SUMMARY_ENV, raising=False)
    repo, _ = _repo(tmp_path)
    run = GateRun(Settings.from_values(), read_trees(repo, "HEAD"))
    run.results = [_timed("t::a", 1.0)]
    run.finish(tmp_path / "ab")
    assert sorted(p.name for p in run.written) == ["ab-baseline.json", "ab-candidate.json", "ab.json"], run.written


# -- the workflow ------------------------------------------------------------------------------------

yaml = pytest.importorskip("yaml", reason="reads the workflow file with PyYAML (pyyaml, in the test extras)")


def _steps() -> tuple[dict, list[dict]]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    return workflow, workflow["jobs"]["gpu"]["steps"]


def test_the_workflow_writes_the_summary_on_a_pull_request_and_posts_it_as_a_comment():
    workflow, steps = _steps()
    gate = next(s for s in steps if "A/B gate" in s.get("name", ""))
    assert "--ab-markdown perf-results/gate-summary.md" in gate["run"], gate["run"]
    post = next((s for s in steps if str(s.get("uses", "")).startswith("actions/github-script")), None)
    assert post is not None, "no step posts the summary"
    assert steps.index(post) > steps.index(gate), "the comment is posted before the gate ran"
    condition = post.get("if", "")
    # The gate fails the job when slower: its summary must be posted then too, on pull requests only.
    assert "!cancelled()" in condition and "github.event_name == 'pull_request'" in condition, condition
    script = post["with"]["script"]
    assert "perf-results/gate-summary.md" in script and MARKER in script, script
    assert "createComment" in script and "updateComment" in script, "one comment, updated on each push"
    assert "context.issue.number" in script, script
    permissions = workflow["jobs"]["gpu"].get("permissions", workflow.get("permissions", {}))
    assert permissions.get("pull-requests") == "write", f"posting needs pull-requests: write, got {permissions}"
    assert permissions.get("contents") == "read", "the checkout needs contents: read once permissions are set"


def test_the_posting_script_is_valid_javascript(tmp_path):
    """actions/github-script runs the script as an async function's body: node checks its syntax."""
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the script's syntax is checked where it is")
    _, steps = _steps()
    script = next(s for s in steps if str(s.get("uses", "")).startswith("actions/github-script"))["with"]["script"]
    wrapped = tmp_path / "post.js"
    wrapped.write_text(f"(async ({{github, context, core, require}}) => {{\n{script}\n}});\n")
    checked = subprocess.run([node, "--check", str(wrapped)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
