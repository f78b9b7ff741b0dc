"""The gate's settings, each of its options declared once (mgpu/options.py's `option`): a field of the
frozen Settings with its default, help, converter and check. One declaration serves every front end:

    Settings.add_to(group.addoption, prefix="ab-", pytest=True, show_defaults=True)   # plugin.py: --ab-threshold
    settings = Settings.read(lambda name: config.getoption("ab_" + name), prefix="ab-")  # gate/session.py
    GateOptions.add_to(parser.add_argument)        # `mgpu gate`: the model, the baseline, ... and these, --threshold
    settings.to_argv(prefix="ab-")                 # back to the plugin's command line (history --confirm)
    Settings.from_values({"threshold": "5%", "workers": "auto"})   # without a parser: the same, from text

Bad option text raises mgpu_perf.errors.GateError, one line naming the option as that front end
spells it (--ab-threshold in the plugin, --threshold in `mgpu gate`). `workers` "auto" becomes the
count sizing.workers_for the threshold and pair bias gives when the object is made.

Light: mgpu.options, mgpu.config, mgpu_perf.errors and gate/sizing.py (no torch, no scipy at import:
the plugin imports it in every run).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mgpu.names import AMP_MODES, STRATEGY_NAMES
from mgpu.option_groups import ModelOptions, device_counts, strategy_names
from mgpu.options import (Options, number_in, option, options_group, percent, percent_shown, shortest,
                          whole_number)
from mgpu.validators import positive_int
from mgpu_perf.errors import GateError
from mgpu_perf.gate.options import GRAPH_MODES
from mgpu_perf.gate.sizing import MAX_WORKERS, PAIR_BIAS, workers_for

__all__ = ["Settings", "GateOptions", "GRAPH_MODES", "AMP_MODES", "COUNT_MODES"]

COUNT_MODES = ("gate", "report", "off")


def _rounds(text: str, flag: str, error: type[Exception]):
    """--ab-max-rounds as an integer; other text named as typed."""
    try:
        return int(text)
    except ValueError:
        raise error(f"{flag} must be an integer >= 3, got {text!r}") from None


def _at_least_3(value, flag: str, error: type[Exception]):
    if isinstance(value, bool) or not isinstance(value, int) or value < 3:
        raise error(f"{flag} must be an integer >= 3, got {value!r}")
    return value


def _workers_text(text: str, flag: str, error: type[Exception]):
    """--ab-workers: `auto`, or a count."""
    if text.strip() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise error(f"{flag} must be {_workers_what()}, got {text!r}") from None


def _workers_what() -> str:
    return f"an integer from 1 to {MAX_WORKERS} or auto"


def _workers_check(value, flag: str, error: type[Exception]):
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS):
        raise error(f"{flag} must be {_workers_what()}, got {value!r}")
    return value



@dataclass(frozen=True, kw_only=True)
class Settings(Options):
    """One gate run's settings: its options (declared here, once) and the fixed values beside them."""

    error = GateError

    threshold: float = option(0.10, metavar="PERCENT", show=percent_shown,
                              text=percent("a percentage in (0, 100)", lambda x: 0 < x < 100),
                              help="the slowdown the gate exists to catch, in percent")  # a fraction
    alpha: float = 0.05       # chance of any false `slower` in a whole run (Holm across benchmarks)
    min_rounds: int = 10
    max_rounds: int = option(200, metavar="N", text=_rounds, check=_at_least_3,
                             help="most rounds per benchmark (>= 3): each runs what its noise needs, at least 40, "
                                  "within --{prefix}budget-s")  # a cap: each benchmark runs the rounds its noise needs
    look_every: int = 5       # rounds between looks at the interval, once min_rounds are in
    warmup: int = 2           # untimed samples per arm before the rounds
    sample_s: float = option(0.25, metavar="SECONDS", show=shortest,
                             text=number_in("a number of seconds in (0, 60]", lambda x: 0 < x <= 60),
                             help="seconds of work in one timed sample, a whole number of steps; longer samples "
                                  "narrow the interval where steps are noisy (a GPU with unlocked clocks)")
    workers: int = option("auto", metavar="N", text=_workers_text, check=_workers_check,
                          help="worker processes per arm, 1 to 8 (auto: as many as the threshold "
                               "needs, 1 at 10, 3 at 5): the rounds rotate through the arms' worker pairs, averaging "
                               "out the bias of one process against another")  # per arm; "auto": resolved when made
    budget_s: float = option(120.0, metavar="SECONDS", show=shortest,
                             text=number_in("a number of seconds > 0", lambda x: x > 0),
                             help="seconds one benchmark may take, its workers' set-up included; a threshold its "
                                  "first rounds' noise cannot decide in them is `undecidable` at once, with the "
                                  "figures")
    run_budget_s: float = option(300.0, metavar="SECONDS", show=shortest,
                                 text=number_in("a number of seconds >= 0 (0: no limit)", lambda x: x >= 0),
                                 help="seconds a whole gate run may take, shared among the benchmarks not yet run "
                                      "(each gets at most --{prefix}budget-s); 0: no limit")
    pair_bias: float = option(PAIR_BIAS, metavar="PERCENT", show=percent_shown,
                              text=percent("a percentage in [0, 50)", lambda x: 0 <= x < 50),
                              help="sd of the bias between two worker processes of one tree (`python -m mgpu_perf "
                                   "calibrate` measures it): a threshold under the floor it sets is `undecidable`")
    graphs: str = option("auto", choices=GRAPH_MODES,
                         help="time CUDA-graph replays of steps that can be captured (single, manual on one GPU); on: "
                              "also say why not on a CPU; off: never")  # harness/graphs.py
    amp: str = option("off", choices=AMP_MODES, help="the gated training steps under bfloat16 autocast")
    compile: bool = option(False, help="the gated training steps' models under torch.compile")
    counts: str = option("gate", choices=COUNT_MODES,
                         help="each benchmark also counts one step in both arms (ops, FLOPs, bytes allocated, "
                              "collectives, host reads, graph breaks); gate: an increase of a guarded count fails the "
                              "run as `slower (counted)` whatever the timing says; report: shown, never failed; off: "
                              "nothing counted")
    strict: bool = option(False, help="an inconclusive or undecidable benchmark fails the run too")
    markdown: str = option("", metavar="FILE",
                           help="also write the verdicts as a Markdown summary to FILE (a pull request's comment; "
                                "under GitHub Actions it is appended to $GITHUB_STEP_SUMMARY whether or not this is "
                                "given)")  # gate/markdown.py; "": none
    smoke: bool = False       # --benchmark-disable: exercise the machinery, judge nothing (three rounds)

    def __post_init__(self):
        if self.workers == "auto":  # as many as the threshold needs at this pair bias (sizing.workers_for)
            object.__setattr__(self, "workers", workers_for(self.threshold, self.pair_bias))

    def validate(self) -> "Settings":
        """Read from a command line: at most max_rounds rounds before the first look; a smoke run
        (--benchmark-disable) three rounds, nothing judged."""
        return dataclasses.replace(self, min_rounds=min(self.min_rounds, self.max_rounds),
                                   max_rounds=3 if self.smoke else self.max_rounds)

    def within(self, seconds: float) -> "Settings":
        """These settings for a gate run given `seconds` in all (history --confirm's share of its budget):
        each benchmark's budget and the run's cut to it (a run budget of 0, no limit, becomes it)."""
        return dataclasses.replace(self, budget_s=min(self.budget_s, seconds),
                                   run_budget_s=seconds if self.run_budget_s <= 0 else min(self.run_budget_s, seconds))


@dataclass(frozen=True, kw_only=True)
class GateOptions(ModelOptions):
    """`python -m mgpu gate`'s options: the model, the baseline, the benchmarks and the gate's own
    Settings (declared there), spelt without the plugin's `ab-`."""

    error = GateError

    baseline: str | None = option(None, metavar="REF", help="a git revision of this repository, or another checkout of it")
    baseline_python: str | None = option(None, metavar="PATH",
                                         help="run the baseline with this Python (another torch/CUDA/NCCL)")
    strategies: tuple[str, ...] = strategy_names(("single",), help=f"strategies to gate, from {','.join(STRATEGY_NAMES)}")
    devices: tuple[int, ...] = device_counts((1,))
    batch: int = option(32, text=whole_number, check=positive_int, help="examples per device")
    settings: Settings = options_group(Settings)
    out: str = option("perf-results", help="folder for ab.json, ab-baseline.json, ab-candidate.json")

    def validate(self) -> "GateOptions":
        if not self.baseline and not self.baseline_python:
            raise self.error("gate needs --baseline REF (a revision of this repository, or another checkout) or "
                             "--baseline-python")
        return self

