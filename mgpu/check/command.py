"""The end of a check command, the same for `mgpu check` and `mgpu check-script`: the one-line
error, Ctrl-C, the report on stdout, `--json`, `--strict` and `--accept-not-verified`.

    ReportOptions.add_to(parser.add_argument)                       # --json, --strict, --accept-not-verified
    return run_check_command(parser, ReportOptions.from_namespace(args), lambda: run_check(spec, options, progress=say))

`report_options` is the command's ReportOptions (mgpu/option_groups.py: --json, --strict and
--accept-not-verified), read once by the command; `run` raises an MgpuError for bad input and returns
a CheckReport.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from mgpu.check.report import CheckReport
from mgpu.errors import end_command
from mgpu.option_groups import ReportOptions

__all__ = ["check_json_path", "run_check_command"]


def check_json_path(parser: argparse.ArgumentParser, path: str | None) -> None:
    """--json's folder exists and is writable, before anything runs (one line, exit 2, if not)."""
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            parser.error(f"cannot write --json {path}: folder {folder} does not exist or is not writable")


def run_check_command(parser: argparse.ArgumentParser, report_options: ReportOptions,
                      run: Callable[[], CheckReport]) -> int:
    """Run the check; print its text; write --json; exit by its verdict (check.report.exit_code: 0,
    1, or 3 for NOT VERIFIED unless --accept-not-verified; --strict fails findings), 2 for bad input
    (one line), 128 + the signal for Ctrl-C or SIGTERM (every rank stopped)."""
    check_json_path(parser, report_options.json)

    def report_and_exit() -> int:
        report = run()
        print(report.text())
        code = report.exit_code(strict=report_options.strict, accept_not_verified=report_options.accept_not_verified)
        if report_options.json is not None:
            report.write_json(report_options.json)
        return code

    return end_command(report_and_exit)
