"""`python -m mgpu history [STORAGE]`: the timed runs pytest-benchmark saved, per machine, ordered by
the branch's first-parent line, with each benchmark's change points (docs/guide/history.md).

    python -m mgpu history                                   # .benchmarks, this repository's HEAD
    python -m mgpu history runs/.benchmarks --json history.json --html history.html
    python -m mgpu history --confirm                         # the A/B gate confirms each suspicion

Exit codes (history/verdicts.py): 0 no slowdown, 1 a slowdown the gate confirmed (--confirm),
2 bad input (one line), 4 a suspected slowdown nothing has confirmed.

--confirm hands the change points to mgpu_perf/history/confirm.py (`confirm_all(points, ConfirmOptions)`:
the repository, --confirm-budget-s, --confirm-out and the gate's own options, read into gate/settings.py's
Settings before anything runs), which returns them with
their verdicts (`slower`, `faster`, `unconfirmed`, `creep`), the commit when found, and a note each;
without that module the option says it is not available.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from dataclasses import replace
from typing import Callable

from mgpu.errors import EXIT_USAGE, MgpuError, one_line
from mgpu_perf.history.errors import HistoryError
from mgpu_perf.history.verdicts import Findings

__all__ = ["run_history_command", "confirm_available"]

CONFIRM_MODULE = "mgpu_perf.history.confirm"


def confirm_available() -> bool:
    return importlib.util.find_spec(CONFIRM_MODULE) is not None


def _confirmed(points, settings, gate) -> Findings:
    """The change points after the gate looked at them, a line each saying what it found (and one for
    what the budget left undone), and those it had no gate time for (suspicions still):
    confirm.py's confirm_all, given the gate's options (`gate`, gate/settings.py's Settings)."""
    confirm = importlib.import_module(CONFIRM_MODULE)
    options = confirm.ConfirmOptions.of(settings, gate, log=lambda line: print(line, file=sys.stderr, flush=True))
    confirmations = confirm.confirm_all(points, options)
    notes = [f"{c.point.benchmark}: {c.note}" for c in confirmations]
    left = confirm.budget_note(confirmations, options.budget_s)
    return Findings(tuple(c.point for c in confirmations), tuple(notes + ([left] if left else [])),
                    tuple(c.point for c in confirmations if c.left_unconfirmed))


def _write(settings, history, findings) -> list[str]:
    from mgpu_perf.history.page import write_page
    from mgpu_perf.history.report import history_json

    written = []
    try:
        if settings.json:
            settings.json.parent.mkdir(parents=True, exist_ok=True)
            settings.json.write_text(json.dumps(history_json(history, findings), indent=2) + "\n", encoding="utf-8")
            written.append(str(settings.json))
        if settings.html:
            written.append(str(write_page(history, findings, settings.html)))
    except OSError as e:  # the analysis is printed already: say which file could not be written
        option = "--html" if settings.json is None or written else "--json"
        raise HistoryError(f"{option}: cannot write {getattr(settings, option[2:])} "
                           f"({e.strerror or e}{f': {e.filename}' if e.filename else ''})") from None
    return written


def run_history_command(args, error: Callable[[str], None]) -> int:
    """The command on parsed arguments (HistorySettings' options, and with --confirm the gate's
    Settings'); `error` ends the program with one line and exit 2 (the parser's)."""
    from mgpu_perf.gate.settings import Settings
    from mgpu_perf.history.build import build_history
    from mgpu_perf.history.settings import CONFIRM_LEAVES_OUT, HistorySettings
    from mgpu_perf.history.since import since_position, split_since
    from mgpu_perf.history.text import history_lines

    try:
        settings = HistorySettings.from_namespace(args)
        gate = Settings.from_namespace(args, leave_out=CONFIRM_LEAVES_OUT) if settings.confirm else None
        if settings.confirm and not confirm_available():
            raise HistoryError("--confirm is not available in this mgpu (mgpu_perf/history/confirm.py is missing); "
                               "the change points are suspicions until the A/B gate confirms them")
        history = build_history(settings)
        judged, earlier = history.change_points, ()
        if settings.since:
            judged, earlier = split_since(judged, history.line, since_position(settings.repo, settings.since, history.line))
        findings = Findings(judged)
        if settings.confirm and findings.points:
            findings = _confirmed(findings.points, settings, gate)
        findings = replace(findings, points=findings.points + earlier)
        _print(history_lines(history, findings))
        _print([f"wrote {path}" for path in _write(settings, history, findings)])
    except (MgpuError, OSError) as e:
        error(one_line(e))
        return EXIT_USAGE  # error() exits; a caller's error() that returns still gets the code
    return findings.exit_code


def _print(lines) -> None:
    """Lines on stdout. A reader that stops early (`mgpu history | head`) ends stdout, not the
    command: its files are still written and its exit code is still the history's."""
    if not lines:
        return
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
