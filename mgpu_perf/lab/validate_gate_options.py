"""validate-gate's options (mgpu_perf/lab/validate_gate.py), each declared once with mgpu/options.py's
`option`: its own, and the gate's that it takes from gate/settings.py's Settings (GATE_OPTIONS).

    ValidateGateOptions.add_all(parser.add_argument)            # --quick, --runs, ..., --threshold, ..., --tree
    options = ValidateGateOptions.from_args(parser.parse_args())  # read, checked; runs, set_runs, plant resolved

Bad option text raises mgpu_perf.errors.GateError, one line naming the option; validate-gate turns it
into its one-line error (exit 2). Light: no torch (the checks that need CUDA or the tree are main's).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from mgpu.options import Options, at_least, number_in, option, options_group, percent_shown, whole_number
from mgpu_perf.errors import GateError
from mgpu_perf.gate.settings import Settings

__all__ = ["GATE_OPTIONS", "ValidateGateOptions"]

GATE_OPTIONS = ("threshold", "max_rounds", "sample_s", "workers")  # the gate's options validate-gate takes


def _count(value, flag: str, error: type[Exception]):
    """--runs, --set-runs: an integer >= 0, or None (their --quick defaults)."""
    return value if value is None else at_least(0)(value, flag, error)


@dataclass(frozen=True, kw_only=True)
class ValidateGateOptions(Options):
    """validate-gate's options, and the gate's it takes (GATE_OPTIONS of gate/settings.py's Settings;
    --threshold is also the slowdown the gate must catch). Read, `runs`, `set_runs` and `plant` hold what
    --quick and --threshold make of them when not given."""

    error = GateError

    quick: bool = option(False, help="5 runs per kind and 1 whole-set run each (~5 min)")
    runs: int | None = option(None, text=whole_number, check=_count, help="single-benchmark runs per kind (default 20)")
    set_runs: int | None = option(None, text=whole_number, check=_count, help="whole gated set runs per kind (default 3)")
    out: str = option("perf-results", help="folder for gate-validation.json")
    settings: Settings = options_group(Settings)
    without_half: bool = option(False, help="leave out the T/2 candidate (it is reported, not judged): a third less time")
    set_forward: float | None = option(None, metavar="PERCENT", text=number_in("a number", lambda x: True),
                                       help="the whole set's slowed candidate has a forward PERCENT slower (the "
                                            "model's, in every process) instead of a step --threshold slower")
    plant: float | None = option(None, metavar="PERCENT", text=number_in("a percentage in (0, 100)", lambda x: 0 < x < 100),
                                 help="the slowed candidate's slowdown in percent (default: --threshold); at or above "
                                      "the threshold an `unchanged` for it is a wrong `unchanged`, counted apart")
    plant_on: str = option("host", choices=("host", "gpu"),
                           help="host: a busy-wait in the step (or forward); gpu: a spin kernel inside ResNet-18's "
                                "forward that CUDA-graph replays run too, sized to the plant's share of an eager "
                                "training step's GPU time (needs CUDA)")
    set_slowed_only: bool = option(False, help="the whole gated set from the slowed candidate only (no same-tree set runs)")
    stop_starting_after_min: float | None = option(None, metavar="MINUTES", text=number_in("a number", lambda x: True),
                                                   help="start no run after this many minutes; the summary holds the runs done")
    tree: str = option(".", help="the checkout of mgpu to validate (default: this folder)")

    @classmethod
    def add_all(cls, add) -> None:
        """Its own options as they always read, the gate's (GATE_OPTIONS) after --out, their defaults shown."""
        own = [f.name for f, _ in cls.declared()]
        cls.add_to(add, only=own[:own.index("out") + 1])
        Settings.add_to(add, only=GATE_OPTIONS, show_defaults=True)
        cls.add_to(add, only=own[own.index("out") + 1:])

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ValidateGateOptions":
        return cls.from_namespace(args, only=tuple(f.name for f, _ in cls.declared()) + GATE_OPTIONS)

    def validate(self) -> "ValidateGateOptions":
        made = replace(self, runs=(5 if self.quick else 20) if self.runs is None else self.runs,
                       set_runs=(1 if self.quick else 3) if self.set_runs is None else self.set_runs,
                       plant=float(percent_shown(self.settings.threshold)) if self.plant is None else self.plant)
        if made.runs + made.set_runs == 0:
            raise self.error("--runs and --set-runs must be at least 0, and one of them positive")
        if made.plant_on == "gpu" and made.set_forward:
            raise self.error("--plant-on gpu and --set-forward: one plant at a time (the GPU plant is in the forward)")
        return made
