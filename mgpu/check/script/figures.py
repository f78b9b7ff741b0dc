"""Under --whole-run: the figures a script reports, read from the lines its rank 0 wrote (PrintedLine: print,
logging, tqdm's last state; inrank/evaluation.py), and lined up between two runs.

    figures_of(lines)                # [Figure(key=("epoch #: val accuracy #", 1, 1), label="val accuracy", ...)]
    line_up(world_1, rerun, world_n) # [FigureRow(label, world_1=0.3962, rerun=0.3962, world_n=0.4074, ...)]

**A figure** is a number in a line, and its label the words before it (else after it). Lines are lined up by
their template (the line with each number written '#'): the k-th line of a template at world N is the k-th
at world 1, and in it the i-th number is the i-th. A progress bar (tqdm) gives its postfix's `key=value`
pairs only. Dates and clock times are taken out before the numbers are read; warnings, tracebacks, lines
naming a source line (file.py:12), and lines about one rank, device or shard, or the world size, hold no
figure to compare (what they say depends on the world size by design).

**Not compared** (`unmeasured`): figures whose label says they measure time, speed, memory, progress
(epoch, step, iteration, batch counters; a percentage of a bar), or depend on the world size by design
(a per-rank count, the learning rate, which scripts scale with the world size); a label without a word
("[640/60000 (1%)]") says nothing of what it counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Figure", "FigureRow", "figures_of", "line_up", "unmeasured"]

_NUMBER = re.compile(r"(?<![\w.@#])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])%?")
_CLOCK = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?|\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
                    r"(?:<\d{1,2}:\d{2}(?::\d{2})?)?")
_BAR = re.compile(r"\d+%\|.*\||\d+(?:\.\d+)?\s*(?:it/s|s/it)")
_POSTFIX = re.compile(r"([A-Za-z_][\w ./-]*?)\s*=\s*([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)")
_UNMEASURED = re.compile(
    r"\b(?:time|times|timing|sec|secs|second|seconds|ms|min|mins|minutes|hours?|elapsed|eta|took|duration|speed|"
    r"throughput|mfu|tflops|flops|it/s|s/it|samples?/s|tokens?/s|img/s|images?/s|per ?sec|fps|mem|memory|gb|mb|gib|mib|kb|bytes|"
    r"cuda|alloc|allocated|reserved|epoch|epochs|step|steps|iter|iters|iteration|iterations|batch|batches|progress|"
    r"batch[_ ]size|bs|micro[_ ]?batch\w*|grad(?:ient)?[_ ]accum\w*|accum\w*|"
    r"date|data|lr|learning[ _]rate|world|world_size|rank|ranks|gpus?|devices?|nproc|processes|workers|seed|pid|port|"
    r"version|v)\b|[%/]$", re.IGNORECASE)

_NOT_FIGURES = re.compile(r"\w+(?:Warning|Error|Exception)\b|^\s*(?:File \"|Traceback|warnings\.warn)|\.py:\d+|"
                          r"Namespace\(")   # and the script's arguments echoed (their sizes follow the world size)
# a line about one rank or one device (its shard, its count) holds figures that depend on the world size by design
_PER_RANK = re.compile(r"\b(?:rank|local[ _]rank|per[ _-]?(?:rank|device|gpu|process|worker)|this (?:rank|process|device)|"
                       r"shard|world[ _]size|gpus?|devices|processes)\b", re.IGNORECASE)
_LINKS = {"over", "of", "on", "in", "with", "for", "at", "to", "from", "across", "by"}


@dataclass(frozen=True)
class Figure:
    """One number of a line: where it sits (the line's template, its occurrence, the number's place), its label,
    the number as written and its value, and the line's place on the rank's event clock."""

    key: tuple            # (template, k-th line of that template, i-th number in it)
    label: str
    unit: str             # the word right after the number ("s", "GB", "examples")
    text: str
    value: float
    seq: int
    line: str


@dataclass(frozen=True)
class FigureRow:
    """One figure lined up: its values at world 1, its rerun and world N (None where that run has no such line)."""

    key: tuple
    label: str
    unit: str
    line: str
    world_1: Figure | None
    rerun: Figure | None
    world_n: Figure | None


def unmeasured(label: str, unit: str = "") -> bool:
    """A figure of time, speed, memory, progress or a date, or one that depends on the world size by design: by its
    label, or the unit written after it ("3.2 s", "1.2 GB", "120 samples/s")."""
    return not re.search(r"[A-Za-z]", label) or bool(_UNMEASURED.search(label.strip().lower())) or bool(
        unit and re.fullmatch(r"s|ms|us|h|m|min|sec|secs|gb|mb|kb|gib|mib|kib|b|%|\S*/s|\S*/it|it", unit.lower()))


def _value(text: str) -> float:
    return float(text.rstrip("%"))


def figures_of(lines) -> list[Figure]:
    """Every figure of rank 0's lines (PrintedLine), keyed as the module docstring says."""
    out, counts = [], {}
    for line in lines:
        if _NOT_FIGURES.search(line.text) or _PER_RANK.search(line.text):
            continue
        text = _CLOCK.sub("<clock>", line.text)
        if _BAR.search(text):   # a progress bar: its postfix only
            desc = text.split(":", 1)[0] if ":" in text else ""
            pairs = [(m.group(1).strip(), m.group(2), "") for m in _POSTFIX.finditer(text.rsplit("[", 1)[-1])]
            template = "bar " + desc + " " + " ".join(k for k, _, _ in pairs)
        else:
            found = list(_NUMBER.finditer(text))
            template = _NUMBER.sub("#", text)
            pairs = [(_label(text, found, i), m.group(0), _unit(text, m)) for i, m in enumerate(found)]
        if not pairs:
            continue
        k = counts[template] = counts.get(template, 0) + 1
        for i, (label, number, unit) in enumerate(pairs):
            try:
                out.append(Figure((template, k, i), label, unit, number, _value(number), line.seq, line.text))
            except ValueError:
                continue
    return out


def _unit(text: str, m) -> str:
    words = text[m.end():].split()
    return words[0].strip(",;:)]}") if words and not _NUMBER.match(words[0]) else ""


def _label(text: str, found: list, i: int) -> str:
    """The words since the previous number (or the line's start), cut at the last separator among them ("|", ")",
    "]", ",", ";", two spaces, a clock time); "(" or "/" alone: the previous number's label with it ("loss (")."""
    start = found[i - 1].end() if i else 0
    before = text[start:found[i].start()]
    pieces = [p for p in re.split(r"[|)\],;]|\s{2,}|<clock>", before) if p.strip(" :=")]
    label = re.sub(r"[\s:=(\[{}]+", " ", pieces[-1] if pieces else "").strip()
    if not label and i and before.strip() in ("(", "/", "[", "(avg"):
        return f"{_label(text, found, i - 1)} {before.strip()}"
    if label.split()[-1:] and label.split()[-1].lower() in _LINKS:   # "over 54 examples": the noun after it
        label += " " + _unit(text, found[i])
    if not label:
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        label = re.sub(r"[\s:=,;|()\[\]{}]+", " ", text[found[i].end():end]).strip()
    return " ".join(label.split()[-4:])


def line_up(world_1: list[Figure], rerun: list[Figure], world_n: list[Figure]) -> list[FigureRow]:
    """The rows of the three runs' figures by key, in world 1's order (then world N's keys it lacks)."""
    a, b, n = ({f.key: f for f in figs} for figs in (world_1, rerun, world_n))
    keys = list(a) + [k for k in n if k not in a]
    rows = []
    for key in keys:
        first = a.get(key) or n.get(key)
        rows.append(FigureRow(key, first.label, first.unit, first.line, a.get(key), b.get(key), n.get(key)))
    return rows
