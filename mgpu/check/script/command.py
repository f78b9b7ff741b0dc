"""`mgpu check-script`'s command line: its arguments, declared once (the options: ScriptCheckOptions,
plan.py; the report: ReportOptions; the script and its ARGS: ScriptArguments here), read once, and the
check core's command ending (mgpu/check/command.py: one-line errors, Ctrl-C, --json, --strict,
--accept-not-verified)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from mgpu.check.command import run_check_command
from mgpu.errors import OneLineParser, one_line
from mgpu.check.script.plan import ScriptCheckError, ScriptCheckOptions, Target
from mgpu.option_groups import ReportOptions
from mgpu.options import REMAINDER, Options, option

__all__ = ["ScriptArguments", "build_parser", "add_arguments", "main", "run_main"]


def build_parser(prog: str = "mgpu check-script") -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                      description="Run your training script unchanged at world size 1 and at N ranks (torch's "
                                  "elastic agent, as torchrun) and compare them optimizer step by step.")
    add_arguments(p)
    return p


@dataclass(frozen=True, kw_only=True)
class ScriptArguments(Options):
    """What check-script runs: a script (or, with -m, a module) and its arguments."""

    error = ScriptCheckError

    module: bool = option(False, flag="-m", help="SCRIPT is a module, run as python -m MODULE (as torchrun's -m)")
    script: str = option(positional=True, metavar="SCRIPT", help="the training script (or, with -m, a module)")
    args: tuple[str, ...] = option((), positional=True, nargs=REMAINDER, metavar="ARGS",
                                   help="the script's arguments; {expressions of world_size} are evaluated per run, "
                                        "e.g. --batch-size {64 // world_size}")

    def target(self) -> Target:
        script, module = (None, self.script) if self.module else (self.script, None)
        return Target(script, module, tuple(self.args))


def add_arguments(p) -> None:
    ScriptCheckOptions.add_to(p.add_argument)
    ReportOptions.add_to(p.add_argument)
    ScriptArguments.add_to(p.add_argument)


def main(argv: list[str] | None = None, prog: str = "mgpu check-script") -> int:
    """The command, on its own (`python -m mgpu.scriptcheck`): exit 0, 1, 2 or 3 (NOT VERIFIED)."""
    parser = build_parser(prog)
    return run_main(parser, parser.parse_args(argv))


def run_main(parser, args) -> int:
    """The command on parsed arguments (for a subcommand of `mgpu`): exit 0, 1, 2 or 3 (NOT VERIFIED)."""
    try:
        options = ScriptCheckOptions.from_namespace(args)
        target = ScriptArguments.from_namespace(args).target()
        report_options = ReportOptions.from_namespace(args)
    except ScriptCheckError as e:
        parser.error(one_line(e))
    from mgpu.check.script.check import check_with  # imports torch: after the options are read

    return run_check_command(parser, report_options, lambda: check_with(target, options, progress=_progress))


def _progress(run) -> None:
    state = "failed" if run.failure else f"{len(run.ranks[0].steps)} step(s)"
    print(f"mgpu check-script: {run.name}{' [cuda]' if run.device == 'cuda' else ''}: {state}, "
          f"{run.seconds:.1f} s", file=sys.stderr, flush=True)
