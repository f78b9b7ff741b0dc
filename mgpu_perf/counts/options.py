"""The counted baseline's pytest options, one table: --counts-save FILE, --counts-check FILE,
--counts-strict (counts/plugin.py reads them back; docs/guide/gate.md, "A counted baseline in the
repository").

    add_counts_baseline_options(group.addoption)      # mgpu_perf/plugin.py, in every pytest run

Pytest only, independent of the A/B gate and of --ab-counts: its own names, since it checks out
nothing and times nothing. The rows are gate/options.py's GateOption, so that one form declares
every option of the plugin. A leaf like gate/options.py: the plugin loads it in every pytest run.
"""

from __future__ import annotations

from typing import Callable

from mgpu_perf.gate.options import GateOption

__all__ = ["COUNTS_BASELINE_OPTIONS", "add_counts_baseline_options"]

COUNTS_BASELINE_OPTIONS = (
    GateOption("counts-save", None, "FILE",
               "write the counted step of each gated benchmark (tests marked mgpu_gate) to FILE, a JSON file "
               "kept in the repository; an entry per workload and torch version/device kind (docs/guide/gate.md)"),
    GateOption("counts-check", None, "FILE",
               "count the step of each gated benchmark (no timing, no baseline checkout) and fail where a guarded "
               "count grew or fell against FILE; an entry of another torch or device: not comparable (exit 6)"),
    GateOption("counts-strict", None, "", "with --counts-check: not comparable and no entry fail the run too"),
)


def add_counts_baseline_options(add: Callable) -> None:
    """--counts-save FILE, --counts-check FILE, --counts-strict through pytest's addoption."""
    for option in COUNTS_BASELINE_OPTIONS:
        if option.metavar:
            add(f"--{option.name}", default=None, metavar=option.metavar, help=option.help)
        else:
            add(f"--{option.name}", action="store_true", help=option.help)
