"""`mgpu history`'s settings, each of its options declared once (mgpu/options.py's `option`): a field
of the frozen HistorySettings with its default, help, converter and check.

    HistorySettings.add_to(parser.add_argument, show_defaults=True)     # mgpu_perf/cli.py
    settings = HistorySettings.from_namespace(args)                     # history/command.py
    settings = HistorySettings.from_values({"alpha": "0.05", "min_change": "5%", "confirm_budget_s": "900"})

With --confirm the gate's own options too: gate/settings.py's Settings, as `mgpu gate` spells them
(CONFIRM_LEAVES_OUT aside). Bad option text raises HistoryError, one line naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mgpu.options import Options, number_in, option, percent, percent_shown, shortest
from mgpu_perf.history.errors import HistoryError

__all__ = ["HistorySettings", "STATISTICS", "CONFIRM_LEAVES_OUT"]

STATISTICS = ("median", "min", "mean")  # of a run's stats (pytest-benchmark's names), what may stand for the run
CONFIRM_LEAVES_OUT = ("markdown",)  # the gate's options --confirm does not take: a pull request's summary


def _path(text: str, flag: str, error: type[Exception]) -> Path | None:
    return Path(text) if text else None


def _storage(text: str, flag: str, error: type[Exception]) -> Path:
    """The storage folder, also as pytest-benchmark's --benchmark-storage spells it (`file://DIR`, its
    default scheme); its other storage (`elasticsearch+http://...`) holds no file to read."""
    if text.startswith("file://"):
        return Path(text[len("file://"):] or ".")
    if "://" in text:
        raise error(f"{text}: mgpu history reads pytest-benchmark's file storage only (a folder, or file://DIR)")
    return Path(text)


def _since(text: str, flag: str, error: type[Exception]) -> str | None:
    """--since as git will be asked it: a commit-ish, never an option."""
    text = text.strip()
    if text.startswith("-"):
        raise error(f"{flag} must name a commit (a hash, a branch, a tag), got {text!r}")
    return text or None


def _statistic(text: str, flag: str, error: type[Exception]) -> str:
    statistic = text.strip().lower()
    if statistic not in STATISTICS:
        raise error(f"{flag} must be one of {', '.join(STATISTICS)}, got {text!r}")
    return statistic


@dataclass(frozen=True, kw_only=True)
class HistorySettings(Options):
    error = HistoryError

    storage: Path = option(Path(".benchmarks"), positional=True, nargs="?", metavar="STORAGE", text=_storage,
                           help="pytest-benchmark's storage folder, as --benchmark-autosave writes it "
                                "(<machine>/NNNN_<commit>_<date>.json)")
    repo: Path = option(Path("."), metavar="DIR", text=lambda text, flag, error: Path(text),
                        help="the git repository whose branch orders the runs (its HEAD's first parents)")
    json: Path | None = option(None, metavar="FILE", text=_path,
                               help="write every machine's runs and every change point here")
    html: Path | None = option(None, metavar="FILE", text=_path,
                               help="write one static page here: per benchmark its runs over the commits, the change "
                                    "points marked (no server, no script, nothing fetched)")
    statistic: str = option("median", metavar="STAT", text=_statistic,  # the run's statistic that stands for it
                            help="which of each run's statistics stands for the run: median, min or mean "
                                 "(pytest-benchmark stores each); min where one process's speed wanders within a run, "
                                 "as on a shared VM")
    alpha: float = option(0.01, metavar="P", show=shortest,  # the t-test's level, per change point
                          text=number_in("a probability in (0, 0.5]", lambda p: 0 < p <= 0.5),
                          help="a change point is reported when Student's t-test of the runs either side (their log "
                               "medians) gives p below this")
    min_change: float = option(0.03, metavar="PERCENT", show=percent_shown,  # the smallest step reported (fraction)
                               text=percent("a percentage in [0, 100)", lambda x: 0 <= x < 100),
                               help="and when the medians either side differ by at least this much (smaller steps are "
                                    "noise here)")
    since: str | None = option(None, metavar="REF", text=_since,  # judge only the steps after it (history/since.py)
                               help="judge only the steps made after this commit (the one the last run saw): earlier "
                                    "change points are listed as `earlier`, not confirmed, not counted in the exit "
                                    "code")
    confirm: bool = option(False, help="confirm each suspected change point with the A/B gate between its commits, "
                                       "then bisect to the commit that made it (mgpu_perf/history/confirm.py)")
    confirm_budget_s: float = option(600.0, metavar="SECONDS", show=shortest,  # all the confirming gates together
                                     text=number_in("a number of seconds > 0", lambda x: x > 0),
                                     help="with --confirm: seconds all the gating may take; what it leaves undone is "
                                          "said")
    confirm_out: Path | None = option(None, metavar="DIR", text=_path,  # their reports, kept here when given
                                      help="with --confirm: each gate's reports (ab.json) in a folder of its own here "
                                           "(default: not kept)")
