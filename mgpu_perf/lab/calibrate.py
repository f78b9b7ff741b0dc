"""`python -m mgpu_perf calibrate [--model MODULE:FUNCTION]`: before gating, what the A/B gate can
tell apart on this machine. No baseline: both arms are this tree, as the gate would start them
(fresh workers, the same warm-up and sample sizing), timed for a number of interleaved rounds.

    python -m mgpu_perf calibrate                                  # mgpu's gated set (docs/notes/perf.md)
    python -m mgpu_perf calibrate --model model.py:spec --strategies single,ddp --devices 1,2
    python -m mgpu_perf calibrate --model model.py:spec --threshold 5 --budget-s 300 --workers 4

For each benchmark it prints the per-round noise (the spread of the rounds' log ratios), the rounds
a change of --threshold needs at that noise, what the gate would do (go as asked, stretch the
samples, or say `undecidable`), the smallest change it can call within --max-rounds and
--budget-s, the floor the worker processes set (--pair-bias), and with two or more workers an arm
the bias measured between the worker pairs (the figure to give --pair-bias, read with its rounds:
with few pairs it is rough). Writes calibrate.json into --out. Exit codes: 0 done, 1 a workload
failed, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mgpu.option_groups import known_strategies
from mgpu.options import Options, comma_list, option, options_group
from mgpu_perf.errors import GateError
from mgpu_perf.gate.settings import Settings

__all__ = ["CalibrateOptions", "calibrate_one", "describe", "main"]

PROG = "python -m mgpu_perf calibrate"
GATE_LEFT_OUT = ("run_budget_s", "strict", "markdown")  # a run budget and --strict judge nothing here
GATE_DEFAULTS = {"workers": "2"}  # 2 workers an arm: the pairs' spread is measured from 2 on


def _int(text: str, flag: str, error: type[Exception]) -> int:
    try:
        return int(text)
    except ValueError:
        raise error(f"argument {flag}: invalid int value: {text!r}") from None


def _enough_rounds(value: int, flag: str, error: type[Exception]) -> int:
    if value < 5:
        raise error(f"{flag} must be at least 5, got {value}")
    return value


@dataclass(frozen=True, kw_only=True)
class CalibrateOptions(Options):
    """calibrate's options: the model (optional), its benchmarks, the rounds, and the gate's Settings
    as the gate would run (GATE_LEFT_OUT aside, GATE_DEFAULTS its defaults here)."""

    error = GateError

    model: str | None = option(None, metavar="MODULE:FUNCTION",
                               help="your model (mgpu's model contract); default: mgpu's own gated set")
    strategies: tuple[str, ...] = option(("single",), text=comma_list(str, empty_ok=True), check=known_strategies,
                                         help="with --model: strategies, e.g. single,ddp")
    devices: tuple[int, ...] = option((1,), text=comma_list(int, "comma-separated positive integers such as 1,2"),
                                      help="with --model: device counts, e.g. 1,2")
    batch: int = option(32, text=_int, help="with --model: examples per device")
    input_shape: str | None = option(None, metavar="C,H,W")
    classes: int | None = option(None, text=_int)
    rounds: int = option(20, text=_int, check=_enough_rounds, help="interleaved rounds a benchmark (default 20, >= 5)")
    settings: Settings = options_group(Settings)
    out: str = option("perf-results", help="folder for calibrate.json")

    @classmethod
    def add_all(cls, add) -> None:
        """Every option through `add`: its own as they always read, the gate's with their defaults shown."""
        cls.add_to(add, leave_out=("out",), only=tuple(f.name for f, _ in cls.declared()))
        Settings.add_to(add, leave_out=GATE_LEFT_OUT, defaults=GATE_DEFAULTS, show_defaults=True)
        cls.add_to(add, only=("out",))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "CalibrateOptions":
        return cls.from_namespace(args, leave_out=GATE_LEFT_OUT)


def calibrate_one(result, settings, family_size: int) -> dict:
    """The figures of one benchmark from its rounds (a gate Comparison of this tree against itself)."""
    from mgpu.jsonsafe import finite_or_none
    from mgpu_perf.gate import sizing

    noise = result.noise()
    step_s = (result.median("baseline") + result.median("candidate")) / 2
    sample_s = step_s * result.ops_per_sample
    budget = sizing.Budget(settings.threshold, settings.alpha / family_size, settings.max_rounds, result.round_s,
                           sample_s, settings.budget_s, settings.pair_bias, settings.workers)
    plan = sizing.plan(budget, noise)
    spread = result.pair_spread()
    return {"name": result.name, "spec": result.spec, "rounds": len(result.samples["baseline"]),
            "step_s": step_s, "ops_per_sample": result.ops_per_sample, "sample_s": sample_s,
            "round_s": result.round_s, "noise": finite_or_none(noise),
            "ratio": result.estimate.ratio if result.estimate else None, "pair_spread": spread,
            "clock": result.clock, "graphs": result.graphs, "plan": plan.to_dict()}


def describe(row: dict, threshold: float) -> str:
    """One benchmark's figures in a line."""
    from mgpu_perf.gate.sizing import percent

    plan = row["plan"]
    noise = percent(math.expm1(row["noise"])) if row["noise"] is not None else "unmeasured"
    action = {"go": "decidable as asked", "stretch": f"needs samples of {row['sample_s'] * plan['stretch']:.2g} s",
              "refuse": "undecidable"}[plan["action"]]
    smallest = plan["smallest_detectable"]
    spread = f"; pair spread {percent(row['pair_spread'])}" if row["pair_spread"] is not None else ""
    return (f"{row['name']}: step {row['step_s'] * 1e3:.3g} ms, samples of {row['ops_per_sample']} steps "
            f"({row['sample_s']:.2g} s), timed by {row['clock']}: noise {noise} a round; {threshold * 100:g} % needs "
            f"{plan['rounds_needed']} rounds ({action}); smallest change in the budget "
            f"{'-' if smallest is None else percent(smallest)}; floor {percent(plan['floor'])}{spread}")


def build_parser() -> argparse.ArgumentParser:
    from mgpu.errors import OneLineParser

    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    CalibrateOptions.add_all(p.add_argument)
    return p


def _cases(args: CalibrateOptions, parser, root: Path) -> tuple[list[tuple[str, dict]], bool]:
    """(benchmark, spec) to calibrate, and whether the tree is a checkout of mgpu."""
    from mgpu_perf.gate.baseline import is_mgpu_checkout

    if args.model is None:
        from mgpu_perf.gated import gated_set
        from mgpu_perf.sweep import make_sweep

        return gated_set(make_sweep(None)), is_mgpu_checkout(root)
    from mgpu.errors import MgpuError, one_line
    from mgpu.spec import load_spec

    from mgpu_perf.gate.command import gate_cases, model_in_repository

    try:
        model = model_in_repository(args.model, root)
        load_spec(args.model, input_shape=args.input_shape, classes=args.classes)
        return gate_cases(model, args.strategies, args.devices, args.batch, args.input_shape, args.classes), \
            is_mgpu_checkout(root)
    except (MgpuError, ValueError) as e:
        parser.error(f"{args.model}: {one_line(e)}")


def main(argv: list[str] | None = None) -> int:
    from mgpu.errors import EXIT_FAILED, EXIT_OK, one_line

    from mgpu_perf.gate.arm import ArmError, start_workers
    from mgpu_perf.gate.baseline import repository_root
    from mgpu_perf.gate.compare import compare
    from mgpu_perf.gate.run import with_speed_options
    from mgpu_perf.gate.sizing import percent

    parser = build_parser()
    try:
        args = CalibrateOptions.from_args(parser.parse_args(argv))
    except GateError as e:
        parser.error(one_line(e))
    settings = args.settings
    root = repository_root(Path.cwd())
    cases, mgpu_itself = _cases(args, parser, root)
    # Every round taken, none stopped early, none sized: the figures are what the gate would size from.
    timing = dataclasses.replace(settings, min_rounds=args.rounds, max_rounds=args.rounds, look_every=10**6,
                                 pair_bias=0.0)
    workdir = Path(tempfile.mkdtemp(prefix="mgpu-calibrate-"))
    rows, pools = [], {}
    try:
        pools = start_workers({"baseline": (root, sys.executable), "candidate": (root, sys.executable)},
                              settings.workers, workdir, require_mgpu=mgpu_itself)
        for name, spec in cases:
            print(f"{PROG}: {name} ...", file=sys.stderr, flush=True)
            result = compare(name, with_speed_options(spec, settings), pools, timing, len(cases))
            if result.status == "not comparable":
                print(f"{PROG}: {name}: cannot be set up: {result.reason}", file=sys.stderr)
                continue
            rows.append(calibrate_one(result, settings, len(cases)))
            print(describe(rows[-1], settings.threshold), flush=True)
    except ArmError as e:
        print(f"{PROG}: a workload failed: {one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        for arm in (arm for pool in pools.values() for arm in pool):
            arm.close()
        shutil.rmtree(workdir, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"settings": {"threshold": settings.threshold, "max_rounds": settings.max_rounds,
                           "sample_s": settings.sample_s, "budget_s": settings.budget_s,
                           "pair_bias": settings.pair_bias, "workers": settings.workers, "rounds": args.rounds,
                           "alpha": settings.alpha, "family_size": len(cases)},
              "benchmarks": rows}
    (out / "calibrate.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    spreads = [r["pair_spread"] for r in rows if r["pair_spread"] is not None]
    if spreads:
        print(f"worker pairs: the largest spread measured is {percent(max(spreads))} (the gate assumes "
              f"{settings.pair_bias * 100:g} %: --ab-pair-bias; {settings.workers} pairs, so a rough figure)")
    print(f"wrote {out / 'calibrate.json'}")
    return EXIT_OK
