"""`mgpu history`'s options, one table for every front end (today `python -m mgpu history`; a
pytest option or a lab tool would read the same table). Each front end reads its values back into
HistorySettings through history/settings.py's settings_from, so a default or a help line lives
here once, and the checks live beside HistorySettings.

    add_history_options(parser.add_argument)                               # mgpu_perf/cli.py
    (with --confirm the gate's own options too: gate/options.py's table, as `mgpu gate` spells them)
    settings = settings_from(lambda dest: getattr(args, dest))             # history/command.py

A leaf: it imports nothing of mgpu or mgpu_perf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["HistoryOption", "HISTORY_OPTIONS", "DEFAULTS", "add_history_options"]


@dataclass(frozen=True)
class HistoryOption:
    name: str             # as the command spells it: --min-change; "storage": the positional argument
    default: str | None   # option text, as a user would type it; None: a flag, or no file
    metavar: str
    help: str
    flag: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


HISTORY_OPTIONS = (
    HistoryOption("storage", ".benchmarks", "STORAGE",
                  "pytest-benchmark's storage folder, as --benchmark-autosave writes it (<machine>/NNNN_<commit>_"
                  "<date>.json)"),
    HistoryOption("repo", ".", "DIR", "the git repository whose branch orders the runs (its HEAD's first parents)"),
    HistoryOption("json", None, "FILE", "write every machine's runs and every change point here"),
    HistoryOption("html", None, "FILE", "write one static page here: per benchmark its runs over the commits, the "
                                        "change points marked (no server, no script, nothing fetched)"),
    HistoryOption("statistic", "median", "STAT",
                  "which of each run's statistics stands for the run: median, min or mean (pytest-benchmark stores "
                  "each); min where one process's speed wanders within a run, as on a shared VM"),
    HistoryOption("alpha", "0.01", "P",
                  "a change point is reported when Student's t-test of the runs either side (their log medians) gives p below "
                  "this"),
    HistoryOption("min-change", "3", "PERCENT",
                  "and when the medians either side differ by at least this much (smaller steps are noise here)"),
    HistoryOption("since", None, "REF",
                  "judge only the steps made after this commit (the one the last run saw): earlier change points are "
                  "listed as `earlier`, not confirmed, not counted in the exit code"),
    HistoryOption("confirm", None, "", "confirm each suspected change point with the A/B gate between its commits, "
                                       "then bisect to the commit that made it (mgpu_perf/history/confirm.py)",
                  flag=True),
    HistoryOption("confirm-budget-s", "600", "SECONDS",
                  "with --confirm: seconds all the gating may take; what it leaves undone is said"),
    HistoryOption("confirm-out", None, "DIR", "with --confirm: each gate's reports (ab.json) in a folder of its own "
                                             "here (default: not kept)"),
)

# Each valued option's default text by its dest ("min_change": "3").
DEFAULTS = {option.dest: option.default for option in HISTORY_OPTIONS if option.default is not None}


def add_history_options(add: Callable) -> None:
    """Every option through `add` (argparse's add_argument): the storage as an optional positional
    argument, the others as --NAME, each with its default in the help."""
    for option in HISTORY_OPTIONS:
        if option.name == "storage":
            add(option.dest, nargs="?", default=option.default, metavar=option.metavar,
                help=f"{option.help} (default {option.default})")
        elif option.flag:
            add(f"--{option.name}", action="store_true", help=option.help)
        else:
            shown = f" (default {option.default})" if option.default is not None else ""
            add(f"--{option.name}", default=option.default, metavar=option.metavar, help=option.help + shown)
