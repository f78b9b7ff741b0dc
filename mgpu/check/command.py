"""The end of a check command, the same for `mgpu check` and `mgpu check-script`: the one-line
error, Ctrl-C, the report on stdout, `--json`, `--strict` and `--accept-not-verified`.

    return run_check_command(parser, args, lambda: run_check(spec, options, progress=say))

`args` has `json` (a path or None), `strict` and `accept_not_verified` (add_report_arguments adds
them); `run` raises an MgpuError for bad input and returns a CheckReport.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from mgpu.check.report import CheckReport
from mgpu.errors import EXIT_NOT_VERIFIED, end_command

__all__ = ["add_report_arguments", "check_json_path", "run_check_command"]


def add_report_arguments(parser, json_help: str, strict_help: str) -> None:
    parser.add_argument("--json", default=None, metavar="PATH", help=json_help)
    parser.add_argument("--strict", action="store_true", help=strict_help)
    parser.add_argument("--accept-not-verified", action="store_true",
                        help=f"NOT VERIFIED (nothing differed, but too little was compared to say so) exits 0 "
                             f"instead of {EXIT_NOT_VERIFIED}")


def check_json_path(parser: argparse.ArgumentParser, path: str | None) -> None:
    """--json's folder exists and is writable, before anything runs (one line, exit 2, if not)."""
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"cannot write --json {path}: folder {folder} does not exist or is not writable")


def run_check_command(parser: argparse.ArgumentParser, args, run: Callable[[], CheckReport]) -> int:
    """Run the check; print its text; write --json; exit by its verdict (check.report.exit_code: 0,
    1, or 3 for NOT VERIFIED unless --accept-not-verified; --strict fails findings), 2 for bad input
    (one line), 128 + the signal for Ctrl-C or SIGTERM (every rank stopped)."""
    check_json_path(parser, args.json)

    def report_and_exit() -> int:
        report = run()
        print(report.text())
        if args.json is not None:
            report.write_json(args.json)
        return report.exit_code(strict=args.strict, accept_not_verified=args.accept_not_verified)

    return end_command(report_and_exit)
