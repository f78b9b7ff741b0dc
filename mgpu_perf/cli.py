"""`mgpu bench`, `mgpu gate` and `mgpu history`: the commands mgpu_perf adds to mgpu's command line (entry-point group
`mgpu.commands` in pyproject.toml; mgpu/cli.py loads them, and never imports mgpu_perf by name).

    python -m mgpu bench examples/tiny_lm.py:spec --devices 1,2          # your model's step, timed
    python -m mgpu gate mymodel.py:spec --baseline origin/main           # the A/B gate (mgpu_perf/gate/)
    python -m mgpu history .benchmarks --html history.html               # saved runs over commits (mgpu_perf/history/)
"""

from __future__ import annotations

import argparse
import sys

from mgpu.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, MgpuError, one_line

__all__ = ["add_commands"]


def add_commands(commands) -> dict:
    """Adds `bench`, `gate` and `history` to mgpu's subcommands; their mains, by name."""
    _add_bench_parser(commands)
    _add_gate_parser(commands)
    _add_history_parser(commands)
    return {"bench": _bench_main, "gate": _gate_main, "history": _history_main}


def _add_history_parser(commands) -> None:
    """`mgpu history`: its options from history/settings.py's HistorySettings; the gate's, for --confirm, from
    gate/settings.py's Settings (as `mgpu gate` spells them)."""
    from mgpu_perf.gate.settings import Settings
    from mgpu_perf.history.settings import CONFIRM_LEAVES_OUT, HistorySettings

    h = commands.add_parser("history", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                            help="saved benchmark runs over the branch's commits, per machine, with change points",
                            description="Exit codes: 0 no slowdown, 1 a slowdown the gate confirmed (--confirm), "
                                        "2 bad input, 4 a suspected slowdown (docs/guide/history.md).")
    HistorySettings.add_to(h.add_argument, show_defaults=True)
    Settings.add_to(h.add_argument_group("the A/B gate, with --confirm (as `mgpu gate` takes them)").add_argument,
                    leave_out=CONFIRM_LEAVES_OUT, show_defaults=True)  # no Markdown: confirming is no pull request's


def _history_main(parser: argparse.ArgumentParser, args) -> int:
    from mgpu_perf.history.command import run_history_command

    return run_history_command(args, parser.error)


def _add_bench_parser(commands) -> None:
    from mgpu_perf.bench import BenchOptions  # no torch: its options, declared once

    b = commands.add_parser("bench", allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="time your model's training step under each strategy and device count")
    BenchOptions.add_to(b.add_argument)


def _add_gate_parser(commands) -> None:
    """`mgpu gate`: its options from gate/settings.py's GateOptions (the gate's own declared in Settings, once)."""
    from mgpu_perf.gate.settings import GateOptions

    g = commands.add_parser("gate", allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="the A/B regression gate on your model's step: this working tree against a baseline")
    GateOptions.add_to(g.add_argument)


def _bench_main(parser: argparse.ArgumentParser, args) -> int:
    from pathlib import Path

    from mgpu_perf.bench import BenchOptions

    try:
        options = BenchOptions.from_namespace(args)  # converted and checked: one line, exit 2 on a bad value
    except BenchOptions.error as e:
        parser.error(one_line(e))
    from mgpu.spec import load_spec, validate_spec
    from mgpu_perf.bench import format_table, run_bench, write_outputs
    from mgpu_perf.harness.ranks import RankPoolError

    try:
        validate_spec(load_spec(options.model, input_shape=options.input_shape, classes=options.classes), batch_size=2)
        result = run_bench(options.model, options, log=lambda line: print(f"mgpu bench: {line}", file=sys.stderr, flush=True))
    except (MgpuError, ValueError) as e:
        print(f"mgpu: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except (RankPoolError, FloatingPointError, AssertionError) as e:
        print(f"mgpu: error: {one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    print("\n".join(format_table(result)))
    for path in write_outputs(result, Path(options.out)):
        print(f"wrote {path}")
    return EXIT_OK


def _gate_main(parser: argparse.ArgumentParser, args) -> int:
    from mgpu_perf.errors import GateError
    from mgpu_perf.gate.command import run_gate_command
    from mgpu_perf.gate.settings import GateOptions

    try:
        options = GateOptions.from_namespace(args)
    except GateError as e:
        parser.error(one_line(e))
    return run_gate_command(options, parser.error)
