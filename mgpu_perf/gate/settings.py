"""The gate's settings, read from option text: one Settings a run, whichever front end reads the
options of gate/options.py (the pytest plugin, `python -m mgpu gate`, calibrate, validate-gate).
Every default comes from that table, once; the checks of each value live here, once.

    settings = settings_from(lambda dest: config.getoption("ab_" + dest))   # a front end's values
    settings = parse_settings(OptionValues(threshold="5%", workers="auto"))  # the same, as text

Bad option text raises mgpu_perf.errors.GateError, one line naming the option as the plugin
spells it (--ab-threshold; the commands turn it into their --threshold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mgpu.config import AMP_MODES
from mgpu.validators import number, one_of
from mgpu_perf.errors import GateError
from mgpu_perf.gate.options import DEFAULTS, GATE_OPTIONS, GRAPH_MODES
from mgpu_perf.gate.sizing import MAX_WORKERS, PAIR_BIAS, workers_for

__all__ = ["Settings", "OptionValues", "parse_settings", "settings_from", "GRAPH_MODES", "AMP_MODES", "COUNT_MODES"]

COUNT_MODES = ("gate", "report", "off")

THRESHOLD = float(DEFAULTS["threshold"]) / 100  # --ab-threshold's default, as a fraction


@dataclass(frozen=True)
class Settings:
    threshold: float = THRESHOLD  # the slowdown the gate exists to catch (fraction)
    alpha: float = 0.05       # chance of any false `slower` in a whole run (Holm across benchmarks)
    min_rounds: int = 10
    max_rounds: int = int(DEFAULTS["max_rounds"])  # a cap: each benchmark runs the rounds its noise needs
    look_every: int = 5       # rounds between looks at the interval, once min_rounds are in
    warmup: int = 2           # untimed samples per arm before the rounds
    sample_s: float = float(DEFAULTS["sample_s"])  # target duration of one sample (a whole number of operations)
    workers: int = workers_for(THRESHOLD, PAIR_BIAS)  # per arm (the table's auto at its defaults)
    strict: bool = False      # `inconclusive` (and `undecidable`) fails the run too
    smoke: bool = False       # --benchmark-disable: exercise the machinery, judge nothing
    budget_s: float = float(DEFAULTS["budget_s"])  # seconds one benchmark may take, its set-up included
    run_budget_s: float = float(DEFAULTS["run_budget_s"])  # a whole gate run, shared by the benchmarks left (0: none)
    pair_bias: float = PAIR_BIAS  # sd of one worker pair's bias: sets the threshold's floor
    graphs: str = DEFAULTS["graphs"]  # CUDA-graph steps: auto | on | off (harness/graphs.py)
    amp: str = DEFAULTS["amp"]        # the workloads' --amp: off | bf16
    compile: bool = False     # the workloads' --compile (torch.compile)
    counts: str = DEFAULTS["counts"]  # gate: a guarded count's increase fails the run; report: shown only
    markdown: str = ""        # --ab-markdown FILE: the verdicts as Markdown too (gate/markdown.py); "": none


@dataclass(frozen=True)
class OptionValues:
    """The gate's option values as a front end hands them over: text as typed (`5%`, `auto`, `60`)
    or a number, and the flags; one field for each option of gate/options.py's table, in its order,
    its default the table's. parse_settings checks them."""
    threshold: str | float = DEFAULTS["threshold"]
    max_rounds: str | int = DEFAULTS["max_rounds"]
    sample_s: str | float = DEFAULTS["sample_s"]
    workers: str | int = DEFAULTS["workers"]
    budget_s: str | float = DEFAULTS["budget_s"]
    run_budget_s: str | float = DEFAULTS["run_budget_s"]
    pair_bias: str | float = DEFAULTS["pair_bias"]
    graphs: str = DEFAULTS["graphs"]
    amp: str = DEFAULTS["amp"]
    compile: bool = False
    counts: str = DEFAULTS["counts"]
    strict: bool = False
    markdown: str | None = DEFAULTS["markdown"]


def settings_from(get: Callable[[str], object], smoke: bool = False, leave_out=()) -> Settings:
    """Settings from a front end's option values: get(dest) gives one ("max_rounds"); the options
    left out keep their defaults. GateError (one line, naming the option as the plugin spells it)
    on a bad one."""
    values = OptionValues(**{o.dest: get(o.dest) for o in GATE_OPTIONS if o.name not in leave_out})
    return parse_settings(values, smoke=smoke)


def parse_settings(values: OptionValues = OptionValues(), smoke: bool = False) -> Settings:
    """The gate's settings from option text (`--ab-threshold 5%`, `--ab-max-rounds 60`, `--ab-sample-s 1`,
    `--ab-workers 2`; `auto`: sizing.workers_for the threshold; `--ab-budget-s 300`, `--ab-pair-bias 1`,
    `--ab-graphs off`, `--ab-amp bf16`, `--ab-compile`, `--ab-run-budget-s 600`, `--ab-counts report`);
    `smoke` (--benchmark-disable): three rounds, nothing judged. GateError naming a bad one."""
    percent = number(str(values.threshold).strip().rstrip("%"), "--ab-threshold", "a percentage in (0, 100)",
                     lambda x: 0 < x < 100, error=GateError)
    rounds = _rounds(values.max_rounds)
    seconds = number(values.sample_s, "--ab-sample-s", "a number of seconds in (0, 60]", lambda x: 0 < x <= 60,
                     error=GateError)
    bias = number(str(values.pair_bias).strip().rstrip("%"), "--ab-pair-bias", "a percentage in [0, 50)",
                  lambda x: 0 <= x < 50, error=GateError)
    count = _workers(values.workers, percent / 100, bias / 100)
    budget = number(values.budget_s, "--ab-budget-s", "a number of seconds > 0", lambda x: x > 0, error=GateError)
    run_budget = number(values.run_budget_s, "--ab-run-budget-s", "a number of seconds >= 0 (0: no limit)",
                        lambda x: x >= 0, error=GateError)
    one_of(values.graphs, "--ab-graphs", GRAPH_MODES, error=GateError)
    one_of(values.amp, "--ab-amp", AMP_MODES, error=GateError)
    one_of(values.counts, "--ab-counts", COUNT_MODES, error=GateError)
    return Settings(threshold=percent / 100, max_rounds=3 if smoke else rounds,
                    min_rounds=min(Settings.min_rounds, rounds), strict=bool(values.strict), smoke=bool(smoke),
                    sample_s=seconds, workers=count, budget_s=budget, pair_bias=bias / 100, graphs=values.graphs,
                    amp=values.amp, compile=bool(values.compile), run_budget_s=run_budget, counts=values.counts,
                    markdown=str(values.markdown or ""))


def _rounds(text) -> int:
    try:
        rounds = int(str(text))
    except ValueError:
        raise GateError(f"--ab-max-rounds must be an integer >= 3, got {text!r}") from None
    if rounds < 3:
        raise GateError(f"--ab-max-rounds must be an integer >= 3, got {rounds}")
    return rounds


def _workers(text, threshold: float, pair_bias: float) -> int:
    """Worker processes an arm: the number given, or for `auto` sizing.workers_for the threshold."""
    what = f"an integer from 1 to {MAX_WORKERS} or auto"
    try:
        count = workers_for(threshold, pair_bias) if str(text).strip() == "auto" else int(str(text))
    except ValueError:
        raise GateError(f"--ab-workers must be {what}, got {text!r}") from None
    if not 1 <= count <= MAX_WORKERS:
        raise GateError(f"--ab-workers must be {what}, got {count}")
    return count
