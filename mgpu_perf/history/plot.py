"""One benchmark's runs over the commits as inline SVG, no script: each run a dot (its commit and time
in a tooltip), each stretch between change points its median, each change point a vertical line
between its commits, labelled with its ratio, p and, once confirmed, the commit that made it.

    svg = benchmark_svg(benchmark_history, points)   # points: the change points as they stand now
"""

from __future__ import annotations

from html import escape

from mgpu_perf.history.text import seconds_text

__all__ = ["benchmark_svg", "RUN_COLOUR", "SLOWER_COLOUR", "FASTER_COLOUR", "AXIS_COLOUR"]

# The page's colours, which the browser test looks for in the screenshot's pixels.
RUN_COLOUR = "#1f77b4"
SLOWER_COLOUR = "#d62728"
FASTER_COLOUR = "#2ca02c"
AXIS_COLOUR = "#888888"
WIDTH, HEIGHT = 860, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 70


def _scale(low: float, high: float, out_low: float, out_high: float):
    span = (high - low) or 1.0
    return lambda v: out_low + (v - low) / span * (out_high - out_low)


def _axes(low: float, high: float, y) -> list[str]:
    """Grid lines with their times, then the two axes over them (the browser test finds the x axis)."""
    parts = []
    for k in range(5):
        value = low + (high - low) * k / 4
        parts.append(f'<line x1="{LEFT}" y1="{y(value):.1f}" x2="{WIDTH - RIGHT}" y2="{y(value):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end" font-size="11">'
                     f'{escape(seconds_text(value))}</text>')
    line = f'stroke="{AXIS_COLOUR}" stroke-width="2"'
    return parts + [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" {line}/>',
                    f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" {line}/>']


def _commit_labels(commits: list[str], x) -> list[str]:
    step = max(1, len(commits) // 30)
    base = HEIGHT - BOTTOM + 12
    return [f'<text x="{x(i):.1f}" y="{base}" font-size="10" font-family="monospace" text-anchor="end" '
            f'transform="rotate(-45 {x(i):.1f} {base})">{escape(c[:7])}</text>'
            for i, c in enumerate(commits) if i % step == 0 or i == len(commits) - 1]


def _marker(p, index: dict[str, int], x) -> list[str]:
    colour = SLOWER_COLOUR if p.ratio > 1 else FASTER_COLOUR
    mid = (x(index[p.before_commit]) + x(index[p.after_commit])) / 2
    label = f"{p.ratio:.2f}x p={p.p_value:.1g} {p.verdict}" + (f" at {p.commit[:7]}" if p.commit else "")
    anchor = ' text-anchor="end" dx="-8"' if mid > WIDTH - 220 else ""  # near the right edge: the label goes left
    return [f'<g class="change-point" data-verdict="{escape(p.verdict)}">'
            f'<line x1="{mid:.1f}" y1="{TOP - 8}" x2="{mid:.1f}" y2="{HEIGHT - BOTTOM}" stroke="{colour}" '
            f'stroke-width="3" stroke-dasharray="6 3"/>'
            f'<text x="{mid + 4:.1f}" y="{TOP - 12}" font-size="12" fill="{colour}"{anchor}>{escape(label)}</text>'
            f'<title>{escape(p.before_commit[:10])}..{escape(p.after_commit[:10])}: {escape(seconds_text(p.median_before))}'
            f' -> {escape(seconds_text(p.median_after))}</title></g>']


def _levels(timed, points, index: dict[str, int], x, y) -> list[str]:
    """The median of each stretch between change points, a grey line across it."""
    cuts = sorted(index[p.after_commit] for p in points)
    bounds = [0, *cuts, max(index.values()) + 1]
    parts = []
    for start, end in zip(bounds, bounds[1:]):
        values = sorted(t.seconds for t in timed if start <= index[t.commit] < end)
        if values:
            median = values[len(values) // 2]
            parts.append(f'<line class="level" x1="{x(start) - 4:.1f}" y1="{y(median):.1f}" x2="{x(end - 1) + 4:.1f}" '
                         f'y2="{y(median):.1f}" stroke="#555" stroke-width="2"/>')
    return parts


def benchmark_svg(benchmark, points) -> str:
    """The plot of one BenchmarkHistory with `points`, its change points as they stand now."""
    commits = list(dict.fromkeys(t.commit for t in benchmark.timed))
    index = {c: i for i, c in enumerate(commits)}
    values = [t.seconds for t in benchmark.timed]
    low, high = min(values) * 0.97, max(values) * 1.03
    x = _scale(0, max(len(commits) - 1, 1), LEFT + 15, WIDTH - RIGHT - 15)
    y = _scale(low, high, HEIGHT - BOTTOM, TOP)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="runs" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(benchmark.benchmark)}">']
    parts += _axes(low, high, y) + _commit_labels(commits, x) + _levels(benchmark.timed, points, index, x, y)
    for p in points:
        parts += _marker(p, index, x)
    for t in benchmark.timed:
        parts.append(f'<circle class="run" cx="{x(index[t.commit]):.1f}" cy="{y(t.seconds):.1f}" r="4.5" '
                     f'fill="{RUN_COLOUR}"><title>{escape(t.commit[:10])}: {escape(seconds_text(t.seconds))} '
                     f'({escape(t.file)})</title></circle>')
    parts.append("</svg>")
    return "".join(parts)
