"""The gate's options, one table for its three front ends: the pytest plugin (`--ab-NAME`),
`python -m mgpu gate` and `python -m mgpu_perf calibrate` (`--NAME`). Each reads its values back
into Settings through gate/settings.py's settings_from, so a default or a help line lives here
once (the checks live beside Settings).

    add_gate_options(group.addoption, prefix="ab-")                  # plugin.py
    settings = settings_from(lambda dest: config.getoption("ab_" + dest))   # gate/settings.py

A leaf: it imports nothing of mgpu or mgpu_perf (the plugin loads it in every pytest run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["GateOption", "GATE_OPTIONS", "DEFAULTS", "GRAPH_MODES", "add_gate_options"]

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


GATE_OPTIONS = (
    GateOption("threshold", "10", "PERCENT", "the slowdown the gate exists to catch, in percent"),
    GateOption("max-rounds", "200", "N",
               "most rounds per benchmark (>= 3): each runs what its noise needs, at least 40, within --{p}budget-s"),
    GateOption("sample-s", "0.25", "SECONDS",
               "seconds of work in one timed sample, a whole number of steps; longer samples narrow the interval "
               "where steps are noisy (a GPU with unlocked clocks)"),
    GateOption("workers", "auto", "N",
               "worker processes per arm, 1 to 8 (auto: as many as the threshold needs, 1 at 10, 3 at 5): the rounds "
               "rotate through the arms' worker pairs, averaging out the bias of one process against another"),
    GateOption("budget-s", "120", "SECONDS",
               "seconds one benchmark may take, its workers' set-up included; a threshold its first rounds' noise "
               "cannot decide in them is `undecidable` at once, with the figures"),
    GateOption("run-budget-s", "300", "SECONDS",
               "seconds a whole gate run may take, shared among the benchmarks not yet run (each gets at most "
               "--{p}budget-s); 0: no limit"),
    GateOption("pair-bias", "1.5", "PERCENT",
               "sd of the bias between two worker processes of one tree (`python -m mgpu_perf calibrate` measures "
               "it): a threshold under the floor it sets is `undecidable`"),
    GateOption("graphs", "auto", "{" + ",".join(GRAPH_MODES) + "}",
               "time CUDA-graph replays of steps that can be captured (single, manual on one GPU); on: also say why "
               "not on a CPU; off: never"),
    GateOption("amp", "off", "{off,bf16}", "the gated training steps under bfloat16 autocast"),
    GateOption("compile", None, "", "the gated training steps' models under torch.compile"),
    GateOption("counts", "gate", "{gate,report,off}",
               "each benchmark also counts one step in both arms (ops, FLOPs, bytes allocated, collectives, host "
               "reads, graph breaks); gate: an increase of a guarded count fails the run as `slower (counted)` "
               "whatever the timing says; report: shown, never failed; off: nothing counted"),
    GateOption("strict", None, "", "an inconclusive or undecidable benchmark fails the run too"),
    GateOption("markdown", "", "FILE",
               "also write the verdicts as a Markdown summary to FILE (a pull request's comment; under GitHub "
               "Actions it is appended to $GITHUB_STEP_SUMMARY whether or not this is given)"),
)

# Each valued option's default text by its dest ("max_rounds": "200"): the defaults of Settings and
# parse_settings (gate/settings.py) and of the sizing's pair bias (gate/sizing.py).
DEFAULTS = {option.dest: option.default for option in GATE_OPTIONS if option.default is not None}


def add_gate_options(add: Callable, prefix: str = "", defaults: dict | None = None, leave_out=(),
                     show_defaults: bool = True) -> None:
    """Every gate option through `add` (argparse's add_argument or pytest's addoption), as
    --{prefix}NAME; `defaults` overrides some (calibrate's workers); `show_defaults`: write the
    default into the help (argparse's ArgumentDefaultsHelpFormatter does it itself)."""
    defaults = defaults or {}
    for option in GATE_OPTIONS:
        if option.name in leave_out:
            continue
        text = option.help.replace("{p}", prefix)
        if option.default is None:
            add(f"--{prefix}{option.name}", action="store_true", help=text)
            continue
        default = defaults.get(option.name, option.default)
        add(f"--{prefix}{option.name}", default=default, metavar=option.metavar,
            help=f"{text} (default {default})" if show_defaults and default else text)

