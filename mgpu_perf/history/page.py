"""`mgpu history --html FILE`: one static page, opened from disk, nothing fetched and no script: per
machine, per benchmark its plot (history/plot.py) and a table of its change points.

    write_page(history, findings, Path("history.html"))   # findings None: the history's own
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from mgpu_perf.history.plot import benchmark_svg
from mgpu_perf.history.text import point_line
from mgpu_perf.history.verdicts import Findings

__all__ = ["page_html", "write_page"]

STYLE = ("body{font-family:sans-serif;margin:24px;color:#222}h2{margin-top:32px}h3{font-size:15px;margin:20px 0 4px}"
         "pre{background:#f6f6f6;padding:6px;font-size:12px;white-space:pre-wrap}.summary{font-weight:bold}")


def _key(p) -> tuple:
    return p.machine, p.benchmark, p.before_commit, p.after_commit


def page_html(history, findings: Findings | None = None) -> str:
    """The page's HTML: every plot inline, the change points' lines under each, the summary on top."""
    findings = findings or Findings(history.change_points)
    current = {_key(p): p for p in findings.points}
    body = [f"<h1>Benchmark runs over commits</h1><p>{escape(history.storage)}, ordered by HEAD "
            f"{escape(history.head[:10])}'s first-parent line ({len(history.line)} commits).</p>",
            f'<p class="summary">{escape(findings.summary)}</p>', *(f"<p>{escape(n)}</p>" for n in history.notes)]
    for m in history.machines:
        body.append(f"<h2>Machine {escape(m.machine.label)}</h2><p>{m.runs} run(s); runs of other machines are "
                    "never compared with these.</p>")
        for b in m.benchmarks:
            now = [current.get(_key(p), p) for p in b.change_points]
            plot = benchmark_svg(b, now) if b.timed else "<p>no run with a median above 0 s: nothing to plot</p>"
            body.append(f'<section class="benchmark"><h3>{escape(b.benchmark)}</h3>{plot}')
            found = findings.found_by_gate(m.machine.label, b.benchmark)  # listed, not drawn: no runs of their own
            body.append("<pre>" + escape("\n".join(point_line(p) for p in now + found) or "no change point")
                        + "</pre></section>")
    if history.apart:
        body.append("<h2>Runs not placed</h2><ul>" + "".join(
            f"<li>{escape(a.run.file)}: commit {escape(a.run.commit[:10])}, {escape(a.why)}</li>" for a in history.apart)
            + "</ul>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>mgpu history</title>'
            f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n")


def write_page(history, findings: Findings | None, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page_html(history, findings), encoding="utf-8")
    return path
