"""The gate's option names that are not its Settings: GRAPH_MODES (--ab-graphs' choices, which
harness/graphs.py takes from here) and the counted baseline's pytest options. The gate's own options
are declared once, as fields of gate/settings.py's Settings (mgpu/options.py's `option`).

A leaf: it imports nothing of mgpu or mgpu_perf (the plugin loads it in every pytest run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["GateOption", "GRAPH_MODES", "COUNTS_BASELINE_OPTIONS", "add_counts_baseline_options"]

GRAPH_MODES = ("auto", "on", "off")  # --ab-graphs (harness/graphs.py takes them from here)


@dataclass(frozen=True)
class GateOption:
    name: str               # as the commands spell it: --max-rounds (the plugin: --ab-max-rounds)
    default: str | None     # option text, as a user would type it; None: a flag
    metavar: str
    help: str               # "{p}" stands for the front end's prefix ("ab-" in the plugin)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


# The counted baseline in the repository (mgpu_perf/baseline_counts.py): pytest only, independent of the
# A/B gate and of --ab-counts; its own names, since it checks out nothing and times nothing.
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
