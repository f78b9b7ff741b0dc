"""`mgpu history --confirm` (mgpu_perf/history/confirm.py): each suspected change point put to the
A/B gate, then bisected to the commit that made it, or reported as creep.

- The rule, on a history whose gate is simulated (each commit's step time known, the gate's verdict
  the threshold's rule on their ratio): which gates run, which commit is named, creep, unconfirmed,
  and what a spent budget leaves undone.
- The real thing: a small git repository with a benchmark (a pytest-benchmark test marked
  `mgpu_gate`) whose step sleeps a set time that a commit lengthens, confirmed by the gate itself
  (worktrees, workers, ab.json). Sleeps make the planted ratios hold on a loaded machine: its load
  adds to both arms' steps alike.

    pytest mgpu_perf_tests/test_confirm.py            # the slow ones: -m slow (make test-slow)
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from mgpu_perf.gate.settings import Settings
from mgpu_perf.history.changes import ChangePoint
from mgpu_perf.history.confirm import (MIN_GATE_S, ConfirmOptions, GateAnswer, budget_note, confirm_all,
                                       confirm_changes, confirm_point, gate_arguments)

THRESHOLD = 0.10


def _commits(n: int) -> list[str]:
    return [f"{i:02d}" + "abcdef0123456789" * 2 + f"{i:06d}" for i in range(n)]  # 40 hex-ish characters


def _point(commits: list[str], ratio: float = 1.2, p_value: float = 0.001, benchmark: str = "t.py::test_step"):
    return ChangePoint(benchmark, "machine", commits[0], commits[-1], tuple(commits[1:]), 0.1, 0.1 * ratio, ratio,
                       p_value)


class SimulatedGate:
    """The gate's rule on known step times: `slower` above 1 + T/2, `faster` below 1/(1 + T/2),
    else `unchanged`; None (the budget spent) after `allowed` gates."""

    def __init__(self, times: dict[str, float], allowed: int = 100):
        self.times, self.allowed, self.asked = times, allowed, []

    def __call__(self, baseline: str, candidate: str) -> GateAnswer | None:
        if len(self.asked) == self.allowed:
            return None
        self.asked.append((baseline, candidate))
        ratio = self.times[candidate] / self.times[baseline]
        verdict = "slower" if ratio > 1 + THRESHOLD / 2 else "faster" if ratio < 1 / (1 + THRESHOLD / 2) else "unchanged"
        return GateAnswer(verdict, ratio, (ratio * 0.98, ratio * 1.02), 40)


def _steps(commits: list[str], factors: list[float]) -> dict[str, float]:
    """Each commit's step time: the one before it times its factor (the first: 0.1 s)."""
    times, t = {}, 0.1
    for commit, factor in zip(commits, factors):
        t *= factor
        times[commit] = t
    return times


@pytest.mark.parametrize("slow_at", [1, 4, 8])
def test_a_step_is_bisected_to_the_commit_that_made_it(slow_at):
    commits = _commits(9)  # before_commit and 8 after it
    gate = SimulatedGate(_steps(commits, [1.0] * slow_at + [1.25] + [1.0] * (8 - slow_at)))
    found = confirm_point(_point(commits), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("slower", commits[slow_at]), (slow_at, found.note)
    assert gate.asked[0] == (commits[0], commits[8]), "the change point's own pair is gated first"
    midpoints = [pair for pair in gate.asked[1:] if pair[0] == commits[0]]
    rest = slow_at < 8  # the named commit against the range's last: nothing more there
    assert len(midpoints) <= 3 and len(gate.asked) <= 5 + rest, \
        f"8 commits need 3 midpoints, a parent and the rest of the range: {gate.asked}"
    if rest:
        assert gate.asked[-1] == (commits[slow_at], commits[8]) and found.then == (), (gate.asked, found.then)
        assert f"the {8 - slow_at} commit(s) after {commits[slow_at][:12]}: unchanged" in found.note, found.note
    assert commits[slow_at][:12] in found.note and "against its parent" in found.note, found.note
    assert [c for _, c, _ in found.gates] == [c for _, c in gate.asked], "every gate run is kept with its answer"


@pytest.mark.parametrize("own", [(3, 5), (2, 5)], ids=["own-pair-unchanged", "own-pair-slower"])
def test_a_slow_commit_followed_by_creep_names_the_commit_and_reports_the_creep_apart(own):
    """The done-when history: commit 3 makes the step 1.2x, commits 5-11 add 2 % each; the detector
    saw one step over them all (its ratio the segments' over commits 0..11; its own pair 3..4, as
    in the scenario run, or 2..4). The gate names commit 3, then finds the rest of the segments'
    span slower again with no single commit above 5 %: a creep of its own, after commit 3."""
    commits = _commits(12)
    gate = SimulatedGate(_steps(commits, [1.0, 1.0, 1.0, 1.2, 1.0] + [1.02] * 7))
    point = replace(_point(commits[own[0]:own[1]], ratio=1.32), from_commit=commits[0], to_commit=commits[-1],
                    span_between=tuple(commits[1:]))
    found = confirm_point(point, gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("slower", commits[3]), found.note
    assert len(found.then) == 1, f"the creep after commit 3 is a change of its own: {found.note}"
    creep = found.then[0]
    assert (creep.point.verdict, creep.point.commit) == ("creep", None), creep.note
    assert (creep.point.before_commit, creep.point.after_commit) == (commits[3], commits[11]), creep.point
    assert creep.point.ratio == pytest.approx(1.02 ** 7) and creep.point.runs_before == 0, creep.point
    assert "creep: commits" in creep.note and "no single commit above 5 %" in creep.note, creep.note
    assert creep.gates and all(c in commits[3:] for b, c, _ in creep.gates), "the creep's own gates, after commit 3"
    assert "confirmed apart, below" in found.note, found.note


def test_two_slow_commits_in_one_range_are_both_named():
    commits = _commits(9)
    gate = SimulatedGate(_steps(commits, [1.0, 1.0, 1.25, 1.0, 1.0, 1.0, 1.3, 1.0, 1.0]))
    found = confirm_point(_point(commits), gate, THRESHOLD)
    named = [found.point.commit, *(later.point.commit for later in found.then)]
    assert named == [commits[2], commits[6]], (found.note, [later.note for later in found.then])
    assert [later.point.verdict for later in found.then] == ["slower"], found.then


def test_a_change_found_by_the_gate_is_listed_under_its_benchmark_in_text_json_and_page_lines():
    import json as json_module

    from mgpu_perf.history.text import point_line
    from mgpu_perf.history.verdicts import Findings

    commits = _commits(12)
    gate = SimulatedGate(_steps(commits, [1.0, 1.0, 1.0, 1.2, 1.0] + [1.02] * 7))
    found = confirm_point(replace(_point(commits[3:5], ratio=1.32), from_commit=commits[0], to_commit=commits[-1],
                                  span_between=tuple(commits[1:])), gate, THRESHOLD)
    creep = found.then[0].point
    findings = Findings((found.point, creep))
    assert findings.found_by_gate("machine", "t.py::test_step") == [creep], "only the gate's own find, not the point"
    assert findings.found_by_gate("other machine", "t.py::test_step") == [], "a machine's finds stay its own"
    line = point_line(creep)
    assert line.startswith("creep") and "p -" in line and "the gate's rounds" in line and "0 runs" not in line, line
    record = creep.to_json()
    assert record["found_by"] == "gate" and record["p_value"] is None, record
    json_module.dumps(record, allow_nan=False)  # strict JSON: no NaN
    assert findings.exit_code == 1 and "2 slowdown(s) confirmed" in findings.summary, findings.summary


def test_confirm_all_lists_a_change_found_after_the_named_commit_right_after_its_point(monkeypatch):
    from mgpu_perf.history import confirm

    commits = _commits(6)
    times = _steps(commits, [1.0, 1.3, 1.0, 1.0, 1.25, 1.0])
    simulated = SimulatedGate(times)
    monkeypatch.setattr(confirm, "gate_between", lambda b, c, *rest: simulated(b, c))
    points = [_point(commits, p_value=0.01), _point(commits[:2], p_value=0.001, benchmark="t.py::test_other")]
    found = confirm_all(points, ConfirmOptions(Path("."), budget_s=600))
    assert [(c.point.benchmark, c.point.commit) for c in found] == [
        ("t.py::test_step", commits[1]), ("t.py::test_step", commits[4]), ("t.py::test_other", commits[1])], \
        [c.note for c in found]


def test_creep_is_reported_as_creep_naming_the_range_and_no_commit():
    commits = _commits(9)
    gate = SimulatedGate(_steps(commits, [1.0] + [1.02] * 8))  # 8 commits of 2 %: 1.17x
    found = confirm_point(_point(commits), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("creep", None), found.note
    expected = f"creep: commits {commits[1][:4]}..{commits[8][:4]}, 8 commits, 1.17x; no single commit above 5 %"
    assert found.note.startswith(expected), found.note
    last = gate.asked[-1]
    assert gate.times[last[1]] / gate.times[last[0]] == pytest.approx(1.02), f"the last gate is a commit vs its parent: {last}"


def _creep_seen_as_one_commit(commits: list[str], step: int):
    """The detector's point in a creep where every commit was timed: one commit (step-1 -> step),
    its ratio the segments' either side, which span all of `commits`."""
    return replace(_point(commits[step - 1:step + 1], ratio=1.09), from_commit=commits[0], to_commit=commits[-1],
                   span_between=tuple(commits[1:]))


def test_a_creep_seen_as_one_commit_is_gated_over_its_segments_span_and_called_creep():
    """The one commit's gate says unchanged (2 %); the span of the segments (8 commits, 1.17x) is
    gated, bisected, and the range named as creep is the span's."""
    commits = _commits(9)
    gate = SimulatedGate(_steps(commits, [1.0] + [1.02] * 8))
    found = confirm_point(_creep_seen_as_one_commit(commits, 5), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("creep", None), (found.note, gate.asked)
    assert gate.asked[:2] == [(commits[4], commits[5]), (commits[0], commits[8])], \
        f"the step's own commit first, then the segments' span: {gate.asked}"
    expected = f"creep: commits {commits[1][:4]}..{commits[8][:4]}, 8 commits, 1.17x; no single commit above 5 %"
    assert found.note.startswith(expected), found.note


class UndecidedAt(SimulatedGate):
    """The simulated gate, but `undecidable` (the noise a round too large for its rounds) for the
    (baseline, candidate) pairs in `undecided`."""

    def __init__(self, times: dict[str, float], undecided: set):
        super().__init__(times)
        self.undecided = undecided

    def __call__(self, baseline: str, candidate: str) -> GateAnswer | None:
        answer = super().__call__(baseline, candidate)
        return replace(answer, verdict="undecidable") if (baseline, candidate) in self.undecided else answer


def test_a_midpoint_the_gate_cannot_decide_stops_the_bisection_with_the_range_not_a_wrong_commit():
    """A 1.25x step at commit 3 or 6 of 8; the first midpoint (commit 4 against 0) undecidable. Read as
    "not slower" it would move the start past a step at 3 and name a wrong commit. The rule: stop, keep
    `slower`, name no commit, say the range and why."""
    commits = _commits(9)
    for slow_at in (3, 6):
        gate = UndecidedAt(_steps(commits, [1.0] * slow_at + [1.25] + [1.0] * (8 - slow_at)), {(commits[0], commits[4])})
        found = confirm_point(_point(commits), gate, THRESHOLD)
        assert (found.point.verdict, found.point.commit) == ("slower", None), (slow_at, found.note)
        assert f"could not decide at {commits[4][:12]}" in found.note and \
            f"{commits[1][:12]}..{commits[8][:12]} (8 commits)" in found.note, found.note


def test_a_last_commit_the_gate_cannot_decide_against_its_parent_is_not_called_creep():
    commits = _commits(9)
    times = _steps(commits, [1.0] + [1.02] * 8)
    plain = confirm_point(_point(commits), SimulatedGate(times), THRESHOLD)
    last = commits.index(plain.gates[-1][1])  # where the bisection ends: its commit gated against its parent
    found = confirm_point(_point(commits), UndecidedAt(times, {(commits[last - 1], commits[last])}), THRESHOLD)
    assert found.point.verdict == "slower" and found.point.commit is None, found.note
    assert "one commit or creep, undecided" in found.note and "creep:" not in found.note, found.note


@pytest.mark.parametrize("allowed, verdict, said", [
    (100, "unconfirmed", "and over the segments' span"),
    (1, "unconfirmed", "left unconfirmed: the gate between"),
])
def test_a_span_the_gate_does_not_confirm_or_cannot_reach_is_unconfirmed_saying_which(allowed, verdict, said):
    """Same code throughout (an A/A history): both gates say unchanged; with the budget for one gate
    only, the span is left ungated and said to be (a suspicion still, as a point never gated)."""
    commits = _commits(9)
    gate = SimulatedGate(_steps(commits, [1.0] * 9), allowed=allowed)
    found = confirm_point(_creep_seen_as_one_commit(commits, 5), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == (verdict, None) and said in found.note, found.note
    assert len(gate.asked) == min(allowed, 2), f"one gate for the step, one for the span: {gate.asked}"
    assert (budget_note([found], 60) is None) == (allowed == 100), budget_note([found], 60)


def test_a_gate_that_says_the_opposite_of_the_runs_decides_and_the_commit_is_named():
    """The machine got faster between two commits: the runs say 0.71x at 5..6, where one block was
    added (gate: unchanged); over the segments' span 0..7 the gate says slower, since commit 3 made
    the step 1.3x: bisected as a slowdown and named, the note saying the runs said the opposite."""
    commits = _commits(8)
    gate = SimulatedGate(_steps(commits, [1.0, 1.0, 1.0, 1.3, 1.0, 1.0, 1.02, 1.0]))
    point = replace(_point(commits[5:7], ratio=0.71), from_commit=commits[0], to_commit=commits[7],
                    span_between=tuple(commits[1:]))
    found = confirm_point(point, gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("slower", commits[3]), (found.note, gate.asked)
    assert "the runs said faster at 0.71x, the gate the opposite" in found.note, found.note


def test_a_suspicion_the_gate_does_not_confirm_is_unconfirmed_after_one_gate():
    commits = _commits(5)
    gate = SimulatedGate(_steps(commits, [1.0, 1.01, 1.0, 1.01, 1.0]))
    found = confirm_point(_point(commits, ratio=1.08), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("unconfirmed", None) and len(gate.asked) == 1, found
    assert "says unchanged at 1.020" in found.note, found.note


def test_a_faster_step_is_named_as_faster():
    commits = _commits(4)
    gate = SimulatedGate(_steps(commits, [1.0, 1.0, 0.7, 1.0]))
    found = confirm_point(_point(commits, ratio=0.7), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("faster", commits[2]), found.note


def test_a_gradual_speed_up_is_faster_with_no_commit_named():
    commits = _commits(9)
    gate = SimulatedGate(_steps(commits, [1.0] + [0.98] * 8))
    found = confirm_point(_point(commits, ratio=0.85), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == ("faster", None), found.note
    assert found.note.startswith("faster, gradually: commits") and "no single commit below 0.952x" in found.note, found.note


def test_a_single_commit_range_is_named_by_its_one_gate():
    commits = _commits(2)
    gate = SimulatedGate(_steps(commits, [1.0, 1.3]))
    found = confirm_point(_point(commits), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit, len(gate.asked)) == ("slower", commits[1], 1), found


@pytest.mark.parametrize("allowed, verdict, said", [
    (0, "unconfirmed", "left unconfirmed: the budget was spent"),
    (2, "slower", "the budget stopped the bisection with the step in"),
])
def test_what_the_budget_leaves_undone_is_said(allowed, verdict, said):
    commits = _commits(9)
    gate = SimulatedGate(_steps(commits, [1.0] * 6 + [1.3, 1.0, 1.0]), allowed=allowed)
    found = confirm_point(_point(commits), gate, THRESHOLD)
    assert (found.point.verdict, found.point.commit) == (verdict, None) and said in found.note, found.note
    assert budget_note([found], 60) is not None and "--confirm-budget-s 60" in budget_note([found], 60)


def test_confirm_all_goes_strongest_first_within_its_budget_and_keeps_the_points_order(monkeypatch):
    """Three points, 25 s of budget, each gate taking 12 s of a simulated clock: the strongest
    (smallest p-value) is gated first, a gate starts only with MIN_GATE_S left, the rest are said
    to be left unconfirmed; the answers come back in the points' own order."""
    from mgpu_perf.history import confirm

    now = [0.0]
    ran = []

    def gate_between(baseline, candidate, benchmark, options, seconds_left, report_dir):
        ran.append((benchmark, seconds_left))
        now[0] += 12.0
        return GateAnswer("slower", 1.3, (1.2, 1.4), 40)

    monkeypatch.setattr(confirm, "gate_between", gate_between)
    points = [_point(_commits(2), p_value=p, benchmark=f"t.py::test_{name}") for name, p in
              [("weak", 0.01), ("strong", 0.0001), ("middle", 0.001)]]
    lines = []
    found = confirm_all(points, ConfirmOptions(Path("."), budget_s=25, clock=lambda: now[0], log=lines.append))
    assert [b for b, _ in ran] == ["t.py::test_strong", "t.py::test_middle"], ran
    assert [left for _, left in ran] == [25, 13] and 25 - 2 * 12 < MIN_GATE_S <= 13, \
        f"each gate is given what is left, and none starts with under MIN_GATE_S: {ran}"
    assert [c.point.verdict for c in found] == ["unconfirmed", "slower", "slower"], [c.note for c in found]
    assert found[0].note.startswith("left unconfirmed"), found[0].note
    assert any("test_weak" in line and "left unconfirmed" in line for line in lines), lines
    assert [p.benchmark for p in confirm_changes(points[:0], ConfirmOptions(Path(".")))] == []


def test_the_gate_runs_with_the_users_options_its_budget_cut_to_what_is_left():
    """One serializer: the gate's Settings as `mgpu history` read them (--threshold 5 ...) become the
    plugin's command line (--ab-threshold 5 ...), which the plugin's declaration (the same one) reads
    back into the same settings, the budgets cut to what is left (Settings.within), no Markdown."""
    import argparse

    given = Settings.from_values({"threshold": "5", "strict": True, "markdown": "x.md", "sample_s": "0.1",
                                  "pair_bias": "0.7", "graphs": "off"})
    args = gate_arguments(given, seconds_left=42.0)
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--ab-threshold"] == "5" and "--ab-strict" in args and "--ab-markdown" not in args, args
    assert (pairs["--ab-budget-s"], pairs["--ab-run-budget-s"]) == ("42", "42"), args
    assert pairs["--ab-workers"] == str(given.workers), "the count the user's threshold resolved, as it was"
    plugin = argparse.ArgumentParser()
    Settings.add_to(plugin.add_argument, prefix="ab-", pytest=True, show_defaults=True)  # as plugin.py adds them
    read = Settings.from_namespace(plugin.parse_args(args), prefix="ab-")
    assert read == replace(given.within(42.0), markdown=""), (read, given)
    assert given.within(1000.0) == given and replace(given, run_budget_s=0.0).within(42.0).run_budget_s == 42.0, \
        "a budget under what is left stays; no run budget (0) becomes what is left"


# -- the real gate, on a repository's history ---------------------------------------------------------

MODEL = '''
import time

import torch
from torch import nn

from mgpu.spec import ModelSpec

DELAY_S = {delay!r}  # the step's planted time: the history's commits change it


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 4)

    def forward(self, x):
        time.sleep(DELAY_S)
        return self.a(x)


def draw(n, g):
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def spec():
    return ModelSpec(build=Net, draw=draw, name="sleepy")
'''

TEST = '''
import pytest


@pytest.mark.mgpu_gate(model="model.py:spec", strategy="single", devices=1, batch=8)
def test_step(mgpu_workload, benchmark):
    benchmark(mgpu_workload.op)
'''

BENCHMARK = "test_speed.py::test_step"  # its pytest-benchmark fullname: what the history holds


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def history(repo: Path, delays: list[float]) -> list[str]:
    """A repository whose commit i plants a step sleeping delays[i] seconds; the full hashes."""
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "test_speed.py").write_text(textwrap.dedent(TEST))
    for i, delay in enumerate(delays):
        (repo / "model.py").write_text(textwrap.dedent(MODEL.format(delay=delay)) + f"# commit {i}\n")
        _git(repo, "add", "model.py", "test_speed.py")
        _git(repo, "commit", "-q", "-m", f"commit {i}: the step sleeps {delay} s")
    return _git(repo, "rev-list", "--reverse", "HEAD").split()


def confirm_on(repo: Path, points, tmp_path: Path, threshold: str, budget_s: float = 900, max_rounds: str = "12"):
    """confirm_all with the gate at `threshold` percent; a few rounds for a large plant, more (within
    the gate's own budget) where the planted ratios lie nearer the threshold."""
    gate = Settings.from_values({"threshold": threshold, "max_rounds": max_rounds, "sample_s": "0.1"})
    return confirm_all(points, ConfirmOptions(repo, budget_s=budget_s, out=tmp_path / "gates", gate=gate))


def test_a_benchmark_the_gate_cannot_time_is_unconfirmed_saying_why(tmp_path):
    """A benchmark the history timed that carries no `mgpu_gate` marker: its gate runs (pytest in a
    worktree of the candidate, removed after) and times nothing; the point is `unconfirmed`, saying why."""
    history(tmp_path / "repo", [0.1, 0.2])
    (tmp_path / "repo" / "test_plain.py").write_text("def test_plain(benchmark):\n    benchmark(sum, [1, 2])\n")
    _git(tmp_path / "repo", "add", "test_plain.py")
    _git(tmp_path / "repo", "commit", "-q", "-m", "an ungated benchmark")
    commits = _git(tmp_path / "repo", "rev-list", "--reverse", "HEAD").split()
    point = ChangePoint("test_plain.py::test_plain", "m", commits[1], commits[2], (commits[2],), 1e-6, 2e-6, 2.0, 0.01)
    [found] = confirm_on(tmp_path / "repo", [point], tmp_path, threshold="20")
    assert found.point.verdict == "unconfirmed" and found.gates[0][2].verdict == "not gated", found
    assert "no test test_plain.py::test_plain marked mgpu_gate there" in found.note, found.note
    assert _git(tmp_path / "repo", "worktree", "list").count("\n") == 0, "a worktree was left behind"


@pytest.mark.timed  # the gate's verdicts over real workers' samples
@pytest.mark.slow  # 3 gate runs: about 50 s on an idle 2-core machine, minutes under load: make test-slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_the_gate_names_the_commit_that_slowed_the_step(tmp_path):
    """Two commits after the step's last good run: the first doubles the step's sleep (1.5-1.9x a
    step, with the mgpu step's own time under any load here), the second changes nothing. Two gates:
    the range (slower), then its midpoint against the range's start, which is the slow commit
    against its parent: named; then the named commit against the range's last (step 4: the rest,
    which changed nothing). Each gate's ab.json records its candidate's commit."""
    commits = history(tmp_path / "repo", [0.1, 0.2, 0.2])
    [found] = confirm_on(tmp_path / "repo", [ChangePoint(BENCHMARK, "m", commits[0], commits[2], tuple(commits[1:]),
                                                         0.1, 0.2, 2.0, 0.001)], tmp_path, threshold="20")
    assert (found.point.verdict, found.point.commit) == ("slower", commits[1]), (found.note, found.gates)
    assert [(b, c) for b, c, _ in found.gates] == [(commits[0], commits[2]), (commits[0], commits[1]),
                                                   (commits[1], commits[2])], found.gates
    reports = sorted((tmp_path / "gates").glob("*/ab.json"))
    assert [json.loads(r.read_text())["candidate_commit"] for r in reports] == [commits[2], commits[1], commits[2]], \
        reports


@pytest.mark.timed  # the gate's verdicts over real workers' samples
@pytest.mark.slow  # about 3 gate runs of 15-40 s each, by the machine's load: make test-slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_an_unchanged_pair_is_unconfirmed_and_a_run_of_small_commits_is_creep(tmp_path):
    """An A/A pair (a commit that changes only a comment) is `unconfirmed`; six commits each adding
    12 ms to a 100 ms sleep (each at most 1.10x on an idle machine, together 1.24x under a load that
    triples the rest of the step, 1.6x idle) at a 30 % threshold (`slower`: above 1.15) are creep,
    no commit named."""
    commits = history(tmp_path / "repo", [0.1, 0.1, 0.112, 0.124, 0.136, 0.148, 0.160, 0.172])
    same = ChangePoint(BENCHMARK, "m", commits[0], commits[1], (commits[1],), 0.1, 0.11, 1.1, 0.01)
    creep = ChangePoint(BENCHMARK, "m", commits[1], commits[7], tuple(commits[2:]), 0.1, 0.17, 1.7, 0.001)
    found = confirm_on(tmp_path / "repo", [same, creep], tmp_path, threshold="30", max_rounds="60")
    assert (found[0].point.verdict, len(found[0].gates)) == ("unconfirmed", 1), found[0].note
    assert (found[1].point.verdict, found[1].point.commit) == ("creep", None), (found[1].note, found[1].gates)
    assert found[1].note.startswith(f"creep: commits {commits[2][:4]}..{commits[7][:4]}, 6 commits"), found[1].note


@pytest.mark.timed  # the gate's verdicts over real workers' samples
@pytest.mark.slow  # 4 gate runs of 30-60 s at a 10 % threshold: make test-slow
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_a_step_of_twenty_percent_is_named_among_four_commits(tmp_path):
    """The issue's size: a commit that makes the step about 1.2x slower (sleep 0.3 -> 0.38 s), among
    four after the last good run, at the gate's default 10 % threshold: bisected and named."""
    commits = history(tmp_path / "repo", [0.3, 0.3, 0.38, 0.38, 0.38])
    point = ChangePoint(BENCHMARK, "m", commits[0], commits[4], tuple(commits[1:]), 0.3, 0.36, 1.2, 0.001)
    [found] = confirm_on(tmp_path / "repo", [point], tmp_path, threshold="10", budget_s=1200, max_rounds="120")
    assert (found.point.verdict, found.point.commit) == ("slower", commits[2]), (found.note, found.gates)
