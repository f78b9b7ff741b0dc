"""`mgpu check`'s command line: its arguments, declared once (the model: ModelOptions; the check's
settings: CheckOptions, mgpu/config.py; the report: ReportOptions), read once, and the check core's
command ending (mgpu/check/command.py: one-line errors, Ctrl-C, --json, --strict).

    python -m mgpu check examples/tiny_lm.py:spec --json check.json
    python -m mgpu check torchvision.models:resnet18 --input-shape 3,32,32 --classes 10
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from mgpu.check.command import run_check_command
from mgpu.config import MODEL_NAMES, CheckOptions
from mgpu.errors import ConfigError, one_line
from mgpu.option_groups import ModelOptions, ReportOptions
from mgpu.options import option

__all__ = ["CheckedModel", "add_arguments", "run_main"]


@dataclass(frozen=True, kw_only=True)
class CheckedModel(ModelOptions):
    """The model `mgpu check` checks: ModelOptions', or one of mgpu's own by name."""

    model: str = option(positional=True, metavar="MODULE:FUNCTION", pytest=False,
                        help="a function (in a module, or a .py file) returning an nn.Module or an mgpu.ModelSpec; "
                             f"or {' / '.join(MODEL_NAMES)}")


def add_arguments(p) -> None:
    CheckedModel.add_to(p.add_argument)
    CheckOptions.add_to(p.add_argument)
    ReportOptions.add_to(p.add_argument)


def run_main(parser, args) -> int:
    """`python -m mgpu check`: the table on stdout, a progress line per check on stderr, --json;
    the ending (exit codes, one-line errors, Ctrl-C) is the check core's (mgpu/check/command.py)."""
    try:
        model = CheckedModel.from_namespace(args)
        options = CheckOptions.from_namespace(args)
        report_options = ReportOptions.from_namespace(args)
    except ConfigError as e:
        parser.error(one_line(e))
    from mgpu.check.model.check import run_check
    from mgpu.spec import builtin_spec, load_spec

    def run():
        if ":" not in model.model and model.input_shape is None and model.classes is None and model.model in MODEL_NAMES:
            spec = builtin_spec(model.model, width=16 if model.model == "resnet18" else 64)
        else:
            spec = load_spec(model.model, input_shape=model.input_shape, classes=model.classes)
        return run_check(spec, options, progress=lambda line: print(line, file=sys.stderr, flush=True))

    return run_check_command(parser, report_options, run)
