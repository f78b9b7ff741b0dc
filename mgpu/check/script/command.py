"""`mgpu check-script`'s command line: its arguments, its options read once into ScriptCheckOptions,
and the check core's command ending (mgpu/check/command.py: one-line errors, Ctrl-C, --json, --strict,
--accept-not-verified)."""

from __future__ import annotations

import argparse
import sys

from mgpu.check.command import add_report_arguments, run_check_command
from mgpu.errors import OneLineParser, one_line
from mgpu.check.script.plan import (DEFAULT_EPOCH_STEPS, DEFAULT_RANKS, DEFAULT_STEPS, DEFAULT_TIMEOUT, ScriptCheckError,
                                    ScriptCheckOptions, Target)

__all__ = ["build_parser", "add_arguments", "main", "run_main"]


def build_parser(prog: str = "mgpu check-script") -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                      description="Run your training script unchanged at world size 1 and at N ranks (torch's "
                                  "elastic agent, as torchrun) and compare them optimizer step by step.")
    add_arguments(p)
    return p


def add_arguments(p) -> None:
    p.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)), metavar="N[,N...]",
                   help="world sizes to run (world 1 always runs, twice: the reference and its rerun)")
    p.add_argument("--steps", default=str(DEFAULT_STEPS), metavar="K", help="optimizer steps recorded and compared")
    p.add_argument("--whole-run", action="store_true",
                   help="run the script to its own end at every world size, each training epoch cut after "
                        "--epoch-steps optimizer steps, every recorded step compared per epoch (--steps is not used)")
    p.add_argument("--epoch-steps", default=None, metavar="K",
                   help=f"with --whole-run: optimizer steps a training epoch runs before its loader ends the epoch "
                        f"(default {DEFAULT_EPOCH_STEPS})")
    p.add_argument("--timeout", default=str(DEFAULT_TIMEOUT), metavar="S",
                   help="seconds one run (one world size) may take before every rank is stopped")
    add_report_arguments(p, json_help="write the report as JSON here",
                         strict_help="findings fail too (exit 1)")
    p.add_argument("-m", dest="module", action="store_true",
                   help="SCRIPT is a module, run as python -m MODULE (as torchrun's -m)")
    p.add_argument("script", metavar="SCRIPT", help="the training script (or, with -m, a module)")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the script's arguments; {expressions of world_size} are evaluated per run, "
                        "e.g. --batch-size {64 // world_size}")


def main(argv: list[str] | None = None, prog: str = "mgpu check-script") -> int:
    """The command, on its own (`python -m mgpu.scriptcheck`): exit 0, 1, 2 or 3 (NOT VERIFIED)."""
    parser = build_parser(prog)
    return run_main(parser, parser.parse_args(argv))


def run_main(parser, args) -> int:
    """The command on parsed arguments (for a subcommand of `mgpu`): exit 0, 1, 2 or 3 (NOT VERIFIED)."""
    from mgpu.check.script.check import check_with  # imports torch: after the options are read

    try:
        options = ScriptCheckOptions.from_text(args.ranks, args.steps, args.timeout, args.whole_run, args.epoch_steps)
    except ScriptCheckError as e:
        parser.error(one_line(e))
    script, module = (None, args.script) if args.module else (args.script, None)
    target = Target(script, module, tuple(args.args))
    return run_check_command(parser, args, lambda: check_with(target, options, progress=_progress))


def _progress(run) -> None:
    state = "failed" if run.failure else f"{len(run.ranks[0].steps)} step(s)"
    print(f"mgpu check-script: {run.name}{' [cuda]' if run.device == 'cuda' else ''}: {state}, "
          f"{run.seconds:.1f} s", file=sys.stderr, flush=True)
