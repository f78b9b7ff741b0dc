"""The gate's verdicts as a Markdown summary: what a pull request's comment and a GitHub Actions job
summary show (the terminal table and ab.json stay the gate's full record, gate/report.py).

    text = summary_markdown(results, settings, baseline_desc, candidate_desc, commit)
    paths = write_summaries(results, settings, baseline_desc, candidate_desc, commit)

One table row a benchmark: its timed verdict, the ratio (candidate / baseline time) and its
interval, the rounds, and its counted verdict with the guarded counts that changed (an increase of
one is `slower (counted)`; other changes are said as reported, never failed). Reasons a benchmark
has no timed verdict (`not comparable`, `undecidable`) follow the table. The headline says whether
the run fails, by the gate's own exit status, and names the candidate's commit.

write_summaries writes `--ab-markdown FILE` (replaced) and, where GitHub Actions sets
$GITHUB_STEP_SUMMARY, appends the same text there (each gate run of a job adds its own).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from mgpu_perf.counts.judge import NOT_COUNTED, SAME, SLOWER_COUNTED
from mgpu_perf.gate.comparison import Comparison
from mgpu_perf.gate.report import gate_exit_status
from mgpu_perf.gate.settings import Settings

__all__ = ["summary_markdown", "write_summaries", "STEP_SUMMARY_ENV", "MARKER"]

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
MARKER = "<!-- mgpu-ab-gate -->"  # a workflow finds its earlier comment by it, and updates that one
COUNTED_SHOWN = 4  # changes listed in one cell; the rest are counted


def _cell(text: str) -> str:
    """Text safe inside one table cell: no pipe ends the cell, no newline ends the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _timed(r: Comparison) -> tuple[str, str, str, str]:
    """(verdict, ratio, interval, rounds) of one benchmark's row."""
    if r.status == "not comparable" or r.estimate is None:
        return "not comparable", "-", "-", "-"
    low, high = r.interval()
    interval = f"{low:.3f}-{high:.3f}" if r.status == "compared" and math.isfinite(low) and math.isfinite(high) else "-"
    verdict = f"**{r.verdict}**" if r.verdict == "slower" else r.verdict or r.status
    return verdict, f"{r.estimate.ratio:.3f}", interval, str(len(r.samples["baseline"]))


def _counted(r: Comparison) -> str:
    """The counted verdict of one row: the guarded counts that changed (or, for `changed`, what did)."""
    c = r.counted
    if c.verdict == NOT_COUNTED:
        return f"{NOT_COUNTED} ({c.reason})" if c.reason else NOT_COUNTED
    if c.verdict == SAME:
        return "same step"
    listed = c.guarded if c.verdict == SLOWER_COUNTED else c.changes
    shown = "; ".join(listed[:COUNTED_SHOWN]) + (f"; {len(listed) - COUNTED_SHOWN} more" if len(listed) > COUNTED_SHOWN
                                                 else "")
    verdict = f"**{c.verdict}**" if c.verdict == SLOWER_COUNTED else f"{c.verdict} (reported, not failed)"
    return f"{verdict}: {shown}"


def _headline(results: list[Comparison], settings: Settings) -> str:
    tally: dict[str, int] = {}
    for r in results:
        key = r.verdict or r.status
        tally[key] = tally.get(key, 0) + 1
    counted = sum(r.counted.verdict == SLOWER_COUNTED for r in results)
    if counted:
        tally[SLOWER_COUNTED] = counted
    said = ", ".join(f"{n} {verdict}" for verdict, n in tally.items())
    if settings.smoke:
        return f"### mgpu A/B gate: SMOKE RUN, verdicts mean nothing ({said})"
    fails = gate_exit_status(results, settings) != 0
    return f"### mgpu A/B gate: {'fails' if fails else 'passes'} ({said})"


def summary_markdown(results: list[Comparison], settings: Settings, baseline: str, candidate: str,
                     commit: str | None) -> str:
    """The whole summary, ending in a newline."""
    lines = [MARKER, _headline(results, settings), "",
             f"- baseline: {_cell(baseline)}",
             f"- candidate: commit `{commit}`, {_cell(candidate)}" if commit else f"- candidate: {_cell(candidate)}",
             "", "| benchmark | timed | ratio | interval | rounds | counted |", "| --- | --- | --- | ---: | ---: | --- |"]
    notes = []
    for r in results:
        verdict, ratio, interval, rounds = _timed(r)
        name = r.name.split("::")[-1]
        lines.append(f"| `{_cell(name)}` | {verdict} | {ratio} | {interval} | {rounds} | {_cell(_counted(r))} |")
        if r.reason and r.status in ("not comparable", "undecidable"):
            notes.append(f"- `{_cell(name)}`: {r.status}: {_cell(r.reason)}")
    lines += ["", *notes, "" if notes else None,
              f"ratio: candidate / baseline time, the rounds' trimmed mean, with its interval; threshold "
              f"{settings.threshold:.0%}: `slower` = interval above {1 + settings.threshold / 2:.3f}, whole-run "
              f"false-alarm level {settings.alpha} (Holm). A guarded count that grows is `slower (counted)`"
              + (" (shown only: --ab-counts report)." if settings.counts == "report" else ".")]
    return "\n".join(line for line in lines if line is not None) + "\n"


def write_summaries(results: list[Comparison], settings: Settings, baseline: str, candidate: str,
                    commit: str | None) -> list[Path]:
    """The summary written to --ab-markdown FILE (replaced) and appended to $GITHUB_STEP_SUMMARY
    when set; the paths written (none when neither is asked)."""
    targets = [(Path(settings.markdown), "w")] if settings.markdown else []
    if os.environ.get(STEP_SUMMARY_ENV):
        targets.append((Path(os.environ[STEP_SUMMARY_ENV]), "a"))
    if not targets:
        return []
    text = summary_markdown(results, settings, baseline, candidate, commit)
    for path, mode in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, mode, encoding="utf-8") as f:
            f.write(text)
    return [path for path, _ in targets]
