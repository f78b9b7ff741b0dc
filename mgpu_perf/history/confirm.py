"""`mgpu history --confirm`: each suspected change point put to the A/B gate, then bisected to the
commit that made it. On a noisy runner a change point in the stored runs is a suspicion; the gate
times both commits in one job, interleaved, and decides.

    confirmed = confirm_changes(points, ConfirmOptions(repo=Path("."), budget_s=600, log=print))
    [(p.verdict, p.commit) for p in confirmed]     # ("slower", "a1b2..."), ("creep", None), ("unconfirmed", None)

The rule, for one change point whose runs say slower (faster: the same, with `faster`):
1. **Confirm.** The gate between `before_commit` (baseline) and `after_commit` (candidate), on the
   benchmark the history timed (its pytest id, which must be marked `mgpu_gate`): the gate itself,
   `pytest ID --ab-baseline BEFORE` run in a worktree of AFTER (gate/baseline.py checks both commits
   out; the gate's own workers, rounds and verdicts). Not `slower`, and the point's ratio compares
   a wider span (`from_commit`..`to_commit`, the segments either side: where every commit was timed,
   a creep's change point is one commit of 2 % whose segments differ by 10 %): the gate between
   `from_commit` and `to_commit`, and the range becomes that span. Still neither `slower` nor
   `faster`: `unconfirmed`, with what each gate said. A gate that says the opposite of the runs
   decides (the runs' step was the machine's, the gate's pairing cancels it): a point whose runs
   said faster, over a span that the gate says is slower, is bisected as a slowdown.
2. **Bisect** the first-parent commits of the range (`commits_between`, or `span_between`; oldest
   first) as `git bisect` does, each midpoint gated against the range's first commit: `slower` moves
   the end down, `unchanged` or `faster` the start up, to the first commit M that the gate calls
   slower. A midpoint the gate cannot decide (`undecidable`, `inconclusive`) stops the bisection: the
   point keeps its verdict without a commit, and the note names the commits the step lies in.
3. **Name or creep.** M gated against its parent (the bisection's last step when that is
   `before_commit`): `slower` names M (`commit`, the full hash); otherwise no single commit crossed
   the gate's threshold and the range is `creep`: "commits a1b2..f9e8, 8 commits, 1.16x; no single
   commit above 5 %" (half the threshold: what `slower` means). M undecided against its parent is
   neither: the verdict without a commit, "one commit or creep, undecided".
4. **The rest of the range.** A range can hold more than the commit named: a slow commit followed by
   a creep (the detector, between the runs' two levels, saw one step). The named commit M is gated
   against the range's last commit (the segments' span's, when the point has one); `slower` again,
   and that part (M..last) is bisected by steps 2-3 in turn, a change of its own (found by the gate within the point's range: its medians and
   p-value the gate's, no runs either side), listed after the point's, as often as a commit is named
   before the last. Not `slower`: the note says so, and the named commit explains the range.
5. **Budget.** `budget_s` bounds all the gating; the points go strongest first (smallest p-value).
   A gate is not started with under MIN_GATE_S left, and each is given what is left (Settings.within:
   its --ab-budget-s and --ab-run-budget-s cut to it).
   What the budget left undone is said: a point never gated, or whose span was not, is `unconfirmed`
   ("left unconfirmed: ... the budget was spent"), a suspicion still; a confirmed one whose bisection
   stopped keeps its verdict without a commit, and the note gives the commits it narrowed the step to.

Every gate's reports (ab.json, the candidate's commit in it) go to `out` when given.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from mgpu_perf.gate.arm import PACKAGE_DIR
from mgpu_perf.gate.baseline import check_baseline
from mgpu_perf.gate.settings import Settings
from mgpu_perf.history.settings import CONFIRM_LEAVES_OUT, HistorySettings

__all__ = ["ConfirmOptions", "GateAnswer", "Confirmation", "confirm_changes", "confirm_all", "confirm_point",
           "gate_between", "budget_note", "MIN_GATE_S", "VERDICTS"]

VERDICTS = ("slower", "faster", "unconfirmed", "creep")
DIRECTIONS = ("slower", "faster")  # the gate's verdicts that confirm a change
CHANGED = ("slower", "faster", "creep")
DECIDED = ("slower", "faster", "unchanged")  # a gate's answers that bisection may act on: not undecidable, inconclusive
MIN_GATE_S = 10.0   # a gate given less cannot set its workers up and take its first look
GRACE_S = 60.0      # a gate's pytest start and collection, which its run budget does not count


@dataclass(frozen=True)
class ConfirmOptions:
    repo: Path                                   # the repository whose commits the change points name
    budget_s: float = HistorySettings.default_of("confirm_budget_s")  # --confirm-budget-s: all the gating together
    gate: Settings = field(default_factory=Settings)  # the gate's options (threshold, rounds, workers, ...), read
    python: str = sys.executable                 # runs each gate's pytest (mgpu installed, or this checkout)
    out: Path | None = None                      # each gate's reports in a folder of its own here
    log: Callable[[str], None] = field(default=lambda line: None, compare=False)
    clock: Callable[[], float] = field(default=time.perf_counter, compare=False)  # seconds, for the budget

    @classmethod
    def of(cls, settings: HistorySettings, gate: Settings, log: Callable[[str], None]) -> "ConfirmOptions":
        """`mgpu history --confirm`'s: the repository, --confirm-budget-s and --confirm-out of its settings."""
        return cls(repo=settings.repo, budget_s=settings.confirm_budget_s, gate=gate, out=settings.confirm_out, log=log)


@dataclass(frozen=True)
class GateAnswer:
    """What one gate run said about one benchmark: the gate's verdict (or `failed`, `not gated`:
    no verdict, the reason says why), its ratio (candidate / baseline time) and interval."""
    verdict: str
    ratio: float | None = None
    interval: tuple | None = None
    rounds: int = 0
    seconds: float = 0.0
    reason: str = ""
    medians: tuple | None = None   # (baseline, candidate): seconds an operation, the gate's own samples
    p_slower: float | None = None  # the gate's one-sided p-value of "slower by more than T/2"

    def said(self) -> str:
        if self.ratio is None:
            return f"{self.verdict} ({self.reason})" if self.reason else self.verdict
        interval = f" [{self.interval[0]:.3f}, {self.interval[1]:.3f}]" if self.interval else ""
        return f"{self.verdict} at {self.ratio:.3f}{interval} over {self.rounds} rounds"


@dataclass(frozen=True)
class Confirmation:
    point: object          # the ChangePoint (history/changes.py), its verdict and commit set
    note: str              # one line: what the gate found, or what the budget left undone
    gates: tuple = ()      # ((baseline commit, candidate commit, GateAnswer), ...) in the order run
    then: tuple = ()       # Confirmations of what the range held after the named commit (rule, step 4)

    @property
    def left_unconfirmed(self) -> bool:
        """The budget was spent before this point (or its span) could be gated: a suspicion still."""
        return self.note.startswith("left unconfirmed")

    def to_json(self) -> dict:
        return {**self.point.to_json(), "note": self.note,
                "gates": [{"baseline": b, "candidate": c, "verdict": a.verdict, "ratio": a.ratio,
                           "interval": list(a.interval) if a.interval else None, "rounds": a.rounds,
                           "seconds": round(a.seconds, 1), "reason": a.reason} for b, c, a in self.gates]}


# -- one gate run ------------------------------------------------------------------------------------

def gate_arguments(gate: Settings, seconds_left: float) -> list[str]:
    """The gate's options as the gate's pytest reads them back (--ab-NAME, the same declaration): those
    not at their defaults, the budgets cut to `seconds_left` (Settings.within); no Markdown summary
    (confirming is history's report, not a pull request's)."""
    return gate.within(seconds_left).to_argv(prefix="ab-", leave_out=CONFIRM_LEAVES_OUT)


def _environment() -> dict:
    """The gate's pytest: this harness found (installed or not), no pytest options of the caller's,
    and no GitHub job summary (each confirming gate would add its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "GITHUB_STEP_SUMMARY")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(PACKAGE_DIR.parent)]))
    return env


def _answer_from(report_dir: Path, benchmark: str, done: subprocess.CompletedProcess, seconds: float) -> GateAnswer:
    """The benchmark's verdict from the gate's ab.json, or why there is none."""
    report = report_dir / "ab.json"
    tail = " | ".join(line for line in (done.stdout + done.stderr).splitlines()[-4:] if line.strip())[-400:]
    if done.returncode == 5:  # pytest: no test ran
        return GateAnswer("not gated", seconds=seconds, reason=f"no test {benchmark} marked mgpu_gate there")
    if not report.is_file():
        return GateAnswer("failed", seconds=seconds, reason=f"the gate wrote no report (exit {done.returncode}): {tail}")
    benchmarks = json.loads(report.read_text()).get("benchmarks", [])
    found = next((b for b in benchmarks if b["name"] == benchmark), None)
    if found is None:
        return GateAnswer("failed", seconds=seconds, reason=f"the gate did not judge it (exit {done.returncode}): {tail}")
    interval = found.get("interval")
    medians = (found.get("baseline_median_s"), found.get("candidate_median_s"))
    return GateAnswer(found["verdict"] or found["status"], found.get("ratio"),
                      tuple(interval) if interval and None not in interval else None, found.get("rounds", 0),
                      seconds, found.get("reason", ""), medians if None not in medians else None, found.get("p_slower"))


def gate_between(baseline: str, candidate: str, benchmark: str, options: ConfirmOptions, seconds_left: float,
                 report_dir: Path) -> GateAnswer:
    """The A/B gate, baseline commit against candidate commit, on one benchmark (its pytest id), as a
    user runs it: `pytest ID --ab-baseline BASELINE` in a worktree of the candidate commit (the gate
    checks the baseline out itself). Its reports go to `report_dir`."""
    began = time.perf_counter()
    try:
        tree_of = check_baseline(candidate, Path(options.repo).resolve())  # the gate's worktree, at the candidate
        tree = tree_of.checkout()
    except ValueError as e:
        return GateAnswer("failed", reason=str(e).replace("--ab-baseline ", ""))
    command = [options.python, "-m", "pytest", benchmark, "--ab-baseline", baseline, "--perf-out", str(report_dir),
               "-p", "mgpu_perf.plugin", "-p", "no:cacheprovider", "-q", "-rs",
               *gate_arguments(options.gate, seconds_left)]
    try:
        done = subprocess.run(command, cwd=tree, env=_environment(), capture_output=True, text=True,
                              timeout=seconds_left + GRACE_S)
    except subprocess.TimeoutExpired:  # its workers end when their pipe does
        return GateAnswer("failed", seconds=time.perf_counter() - began,
                          reason=f"the gate ran past its {seconds_left:.0f} s and was stopped")
    finally:
        tree_of.remove()
    return _answer_from(report_dir, benchmark, done, time.perf_counter() - began)


# -- one change point ----------------------------------------------------------------------------------

Gate = Callable[[str, str], "GateAnswer | None"]  # (baseline, candidate) -> answer; None: the budget is spent


def _short(commit: str) -> str:
    return commit[:4]


def _percent(fraction: float) -> str:
    return f"{fraction * 100:g} %"


def _span(point) -> tuple:
    """The commits whose runs the point's ratio compares (from_commit, *span_between), oldest first;
    () when that span is no wider than the step's own range (before_commit..after_commit)."""
    if point.from_commit is None or not point.span_between:
        return ()
    span = (point.from_commit, *point.span_between)
    return () if (span[0], span[-1]) == (point.before_commit, point.after_commit) else span


def confirm_point(point, gate: Gate, threshold: float) -> Confirmation:
    """One change point through the gate (the module's rule, steps 1-4): `gate(baseline, candidate)`
    runs or recalls one gate, None when the budget cannot start it. `threshold`: the gate's (fraction)."""
    direction = "slower" if point.ratio > 1 else "faster"
    line = (point.before_commit, *point.commits_between)
    if line[-1] != point.after_commit:
        line = (*line, point.after_commit)
    gates = []

    def run(baseline: str, candidate: str) -> GateAnswer | None:
        answer = gate(baseline, candidate)
        if answer is not None:
            gates.append((baseline, candidate, answer))
        return answer

    def done(verdict: str, note: str, commit: str | None = None) -> Confirmation:
        if verdict in CHANGED and direction != runs_said:
            note += (f" (the runs said {runs_said} at {point.ratio:.2f}x, the gate the opposite: the runs' step "
                     "was the machine's)")
        return Confirmation(replace(point, verdict=verdict, commit=commit), note, tuple(gates))

    runs_said = direction
    whole = run(line[0], line[-1])
    if whole is None:
        return done("unconfirmed", "left unconfirmed: the budget was spent before its gate could run")
    if whole.verdict not in DIRECTIONS:
        said = f"the gate between {line[0][:12]} and {line[-1][:12]} says {whole.said()}"
        span = _span(point)
        if not span:
            return done("unconfirmed", f"unconfirmed: {said}")
        wide = run(span[0], span[-1])  # a creep: each commit of the step's range too small, the segments not
        where = f"the segments' span {span[0][:12]}..{span[-1][:12]}"
        if wide is None:
            return done("unconfirmed", f"left unconfirmed: {said}; the budget was spent before {where} could be gated")
        if wide.verdict not in DIRECTIONS:
            return done("unconfirmed", f"unconfirmed: {said}, and over {where} {wide.said()}")
        line, whole = span, wide
    direction = whole.verdict  # the gate's, which decides: runs can step with the machine, the other way
    verdict, note, named, at = _narrow(line, whole, direction, run, threshold)
    wider = _span(point)
    if named in wider and len(wider) > len(line):  # the point's ratio compares the segments: the rest runs to theirs
        line, at = wider, wider.index(named)
    then, commit = [], named
    while commit is not None and at < len(line) - 1:  # step 4: what the range holds after the named commit
        line, ran = line[at:], len(gates)
        rest = run(line[0], line[-1])
        after = f"the {len(line) - 1} commit(s) after {line[0][:12]}"
        if rest is None or rest.verdict != direction:
            note += f"; {after}: {rest.said()}" if rest else f"; the budget left {after} ungated"
            break
        later, note_later, commit, at = _narrow(line, rest, direction, run, threshold)
        then.append(Confirmation(_found_within(point, line, rest, later, commit),
                                 f"after {line[0][:12]}, within the same range: {note_later}", tuple(gates[ran:])))
        note += f"; {after} {rest.said()}: confirmed apart, below"
    return replace(done(verdict, note, commit=named), then=tuple(then))


def _narrow(line: tuple, whole: GateAnswer, direction: str, run: Gate, threshold: float) -> tuple:
    """Steps 2-3 on `line` (oldest first), whose first and last commit the gate called `direction`
    (`whole`): (verdict, note, the commit named or None, its index in line or None)."""
    low, high = 0, len(line) - 1  # line[low] is not `direction` against line[0]; line[high] is
    answers = {high: whole}
    while high - low > 1:
        middle = (low + high) // 2
        answer = run(line[0], line[middle])
        if answer is None:
            return direction, (f"{direction}: {whole.said()}; the budget stopped the bisection with the step in "
                               f"{line[low + 1][:12]}..{line[high][:12]} ({high - low} commits)"), None, None
        answers[middle] = answer
        if answer.verdict not in DECIDED:  # not a "no": the bisection cannot go on from an answer it lacks
            return direction, (f"{direction}: {whole.said()}; the gate could not decide at {line[middle][:12]} "
                               f"({answer.said()}): the step is in {line[low + 1][:12]}..{line[high][:12]} "
                               f"({high - low} commits)"), None, None
        if answer.verdict == direction:
            high = middle
        else:
            low = middle
    first = line[high]
    single = answers[high] if low == 0 else run(line[high - 1], first)
    if single is None:
        return direction, (f"{direction}: {whole.said()}; bisected to {first[:12]}, which the budget left ungated "
                           "against its parent"), None, None
    if single.verdict == direction:
        return direction, (f"{direction}: {first[:12]} ({single.said()} against its parent); the whole range "
                           f"{whole.said()}"), first, high
    if single.verdict not in DECIDED:  # neither named nor shown small: not creep
        return direction, (f"{direction}: {whole.said()}; bisected to {first[:12]}, which the gate could not decide "
                           f"against its parent ({single.said()}): one commit or creep, undecided"), None, None
    commits = len(line) - 1
    limit = f"above {_percent(threshold / 2)}" if direction == "slower" else \
        f"below {1 / (1 + threshold / 2):.3f}x"  # what `slower` (`faster`) means at this threshold
    said = (f"commits {_short(line[1])}..{_short(line[-1])}, {commits} commits, {whole.ratio:.2f}x; no single commit "
            f"{limit} ({first[:12]}, where the bisection ended, is {single.said()} against its parent)")
    if direction == "slower":
        return "creep", f"creep: {said}", None, None
    return "faster", f"faster, gradually: {said}", None, None


def _found_within(point, line: tuple, rest: GateAnswer, verdict: str, commit: str | None):
    """A change the gate found after the commit it named, within the same change point's range
    (line[0]..line[-1]): a ChangePoint of its own whose medians and p-value are the gate's (its
    interleaved rounds; no stored run measured this step apart), with no runs either side."""
    before, after = rest.medians or (point.median_after / rest.ratio, point.median_after)
    return replace(point, before_commit=line[0], after_commit=line[-1], commits_between=tuple(line[1:]),
                   median_before=before, median_after=after, ratio=rest.ratio,
                   p_value=rest.p_slower if rest.p_slower is not None and rest.ratio > 1 else math.nan,  # a p of `slower`
                   verdict=verdict, commit=commit,
                   runs_before=0, runs_after=0, from_commit=None, to_commit=None, span_between=(), found_by="gate")


# -- every change point --------------------------------------------------------------------------------

def _p_value(point) -> float:
    return point.p_value if isinstance(point.p_value, (int, float)) and math.isfinite(point.p_value) else 1.0


def confirm_all(points, options: ConfirmOptions) -> list[Confirmation]:
    """Every change point confirmed (or not) within options.budget_s, strongest first (smallest
    p-value); the confirmations in the points' own order, each followed by the changes the gate found
    after its named commit within its range (rule, step 4), each one logged as it is decided."""
    threshold = options.gate.threshold  # the gate's options were read (and checked) before any point
    deadline = options.clock() + options.budget_s
    # Absolute: each gate's pytest runs in a worktree of its candidate, which is removed after it.
    work = Path(tempfile.mkdtemp(prefix="mgpu-confirm-")) if options.out is None else Path(options.out).resolve()
    recalled: dict[tuple[str, str, str], GateAnswer] = {}
    results: dict[int, Confirmation] = {}
    try:
        strongest_first = sorted(range(len(points)), key=lambda i: (_p_value(points[i]), i))
        for index in strongest_first:
            point = points[index]

            def gate(baseline: str, candidate: str, point=point) -> GateAnswer | None:
                key = (point.benchmark, baseline, candidate)
                if key not in recalled:
                    left = deadline - options.clock()
                    if left < MIN_GATE_S:
                        return None
                    options.log(f"mgpu history: confirming {point.benchmark}: gate {baseline[:12]} -> "
                                f"{candidate[:12]} ({left:.0f} s left) ...")
                    report_dir = work / f"gate-{len(recalled) + 1:03d}-{baseline[:8]}-{candidate[:8]}"
                    recalled[key] = gate_between(baseline, candidate, point.benchmark, options, left, report_dir)
                return recalled[key]

            results[index] = confirm_point(point, gate, threshold)
            for found in (results[index], *results[index].then):
                options.log(f"mgpu history: {point.benchmark} on {point.machine}: {found.note}")
    finally:
        if options.out is None:
            shutil.rmtree(work, ignore_errors=True)
    return [found for i in range(len(points)) for found in (results[i], *results[i].then)]


def confirm_changes(points, options: ConfirmOptions) -> list:
    """The change points with their verdicts (`slower`, `faster`, `unconfirmed`, `creep`) and, where
    the gate named one, `commit`: confirm_all's points, in the same order."""
    return [confirmation.point for confirmation in confirm_all(points, options)]


def budget_note(confirmations: list[Confirmation], budget_s: float) -> str | None:
    """One line when the budget left work undone: how many points it left unconfirmed or unbisected."""
    unconfirmed = sum(c.left_unconfirmed for c in confirmations)
    unbisected = sum("the budget" in c.note and not c.left_unconfirmed for c in confirmations)
    if not unconfirmed and not unbisected:
        return None
    return (f"--confirm-budget-s {budget_s:g} left {unconfirmed} change point(s) unconfirmed and {unbisected} "
            "confirmed but not bisected to one commit; give it more to finish")
