"""The counted baseline's pytest options, declared once (mgpu/options.py): --counts-save FILE,
--counts-check FILE, --counts-strict (counts/plugin.py reads them back; docs/guide/gate.md, "A counted
baseline in the repository").

    add_counts_baseline_options(group.addoption)      # mgpu_perf/plugin.py, in every pytest run

Pytest only, independent of the A/B gate and of --ab-counts: its own names, since it checks out
nothing and times nothing. A leaf beside mgpu/options.py: the plugin loads it in every pytest run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mgpu.options import Options, option

__all__ = ["CountsBaselineOptions", "add_counts_baseline_options"]


@dataclass(frozen=True, kw_only=True)
class CountsBaselineOptions(Options):
    counts_save: str | None = option(
        None, metavar="FILE",
        help="write the counted step of each gated benchmark (tests marked mgpu_gate) to FILE, a JSON file kept in "
             "the repository; an entry per workload and torch version/device kind (docs/guide/gate.md)")
    counts_check: str | None = option(
        None, metavar="FILE",
        help="count the step of each gated benchmark (no timing, no baseline checkout) and fail where a guarded "
             "count grew or fell against FILE; an entry of another torch or device: not comparable (exit 6)")
    counts_strict: bool = option(False, help="with --counts-check: not comparable and no entry fail the run too")


def add_counts_baseline_options(add: Callable) -> None:
    """--counts-save FILE, --counts-check FILE, --counts-strict through pytest's addoption."""
    CountsBaselineOptions.add_to(add, pytest=True)
