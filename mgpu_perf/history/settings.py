"""`mgpu history`'s settings, read from option text: one HistorySettings a run, whichever front end
reads the options of history/options.py. Every default comes from that table; every check is here.

    settings = settings_from(lambda dest: getattr(args, dest))
    settings = parse_settings(HistoryValues(alpha="0.05", min_change="5%", confirm_budget_s="900"))

Bad option text raises HistoryError, one line naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mgpu.validators import number
from mgpu_perf.history.errors import HistoryError
from mgpu_perf.history.options import DEFAULTS, HISTORY_OPTIONS

__all__ = ["HistorySettings", "HistoryValues", "settings_from", "parse_settings", "STATISTICS"]

STATISTICS = ("median", "min", "mean")  # of a run's stats (pytest-benchmark's names), what may stand for the run


@dataclass(frozen=True)
class HistorySettings:
    storage: Path = Path(DEFAULTS["storage"])
    repo: Path = Path(DEFAULTS["repo"])
    json: Path | None = None
    html: Path | None = None
    statistic: str = DEFAULTS["statistic"]               # the run's statistic that stands for it (STATISTICS)
    alpha: float = float(DEFAULTS["alpha"])              # the t-test's level, per change point
    min_change: float = float(DEFAULTS["min_change"]) / 100  # the smallest step reported (fraction)
    since: str | None = None                             # judge only the steps after this commit (history/since.py)
    confirm: bool = False
    confirm_budget_s: float = float(DEFAULTS["confirm_budget_s"])  # all the confirming gates together
    confirm_out: Path | None = None                                # their reports, kept here when given


@dataclass(frozen=True)
class HistoryValues:
    """The option values as a front end hands them over: text as typed (`5%`, `0.05`) or a number, and
    the flags; one field for each option of history/options.py's table, its default the table's."""
    storage: str | Path = DEFAULTS["storage"]
    repo: str | Path = DEFAULTS["repo"]
    json: str | Path | None = None
    html: str | Path | None = None
    statistic: str = DEFAULTS["statistic"]
    alpha: str | float = DEFAULTS["alpha"]
    min_change: str | float = DEFAULTS["min_change"]
    since: str | None = None
    confirm: bool = False
    confirm_budget_s: str | float = DEFAULTS["confirm_budget_s"]
    confirm_out: str | Path | None = None


def settings_from(get: Callable[[str], object]) -> HistorySettings:
    """HistorySettings from a front end's values: get(dest) gives one ("min_change")."""
    return parse_settings(HistoryValues(**{option.dest: get(option.dest) for option in HISTORY_OPTIONS}))


def _path(value) -> Path | None:
    return Path(value) if value else None


def _storage(value) -> Path:
    """The storage folder, also as pytest-benchmark's --benchmark-storage spells it (`file://DIR`, its
    default scheme); its other storage (`elasticsearch+http://...`) holds no file to read."""
    text = str(value)
    if text.startswith("file://"):
        return Path(text[len("file://"):] or ".")
    if "://" in text:
        raise HistoryError(f"{text}: mgpu history reads pytest-benchmark's file storage only (a folder, or file://DIR)")
    return Path(value)


def _since(value) -> str | None:
    """--since as git will be asked it: a commit-ish, never an option."""
    text = str(value).strip() if value else ""
    if text.startswith("-"):
        raise HistoryError(f"--since must name a commit (a hash, a branch, a tag), got {text!r}")
    return text or None


def parse_settings(values: HistoryValues = HistoryValues()) -> HistorySettings:
    """The settings from option text (`--alpha 0.05`, `--min-change 5%`, `--confirm-budget-s 900`).
    HistoryError naming a bad one."""
    statistic = str(values.statistic).strip().lower()
    if statistic not in STATISTICS:
        raise HistoryError(f"--statistic must be one of {', '.join(STATISTICS)}, got {values.statistic!r}")
    level = number(values.alpha, "--alpha", "a probability in (0, 0.5]", lambda p: 0 < p <= 0.5, error=HistoryError)
    percent = number(str(values.min_change).strip().rstrip("%"), "--min-change", "a percentage in [0, 100)",
                     lambda x: 0 <= x < 100, error=HistoryError)
    budget = number(values.confirm_budget_s, "--confirm-budget-s", "a number of seconds > 0", lambda x: x > 0,
                    error=HistoryError)
    return HistorySettings(storage=_storage(values.storage), repo=Path(values.repo), json=_path(values.json),
                           html=_path(values.html), statistic=statistic, alpha=level, min_change=percent / 100,
                           since=_since(values.since), confirm=bool(values.confirm),
                           confirm_budget_s=budget, confirm_out=_path(values.confirm_out))
