"""The option groups several commands share, declared once (mgpu/options.py's `option`): a command's
options class inherits the groups it takes, and redeclares a field only to give it another default.

    @dataclass(frozen=True, kw_only=True)
    class BenchOptions(ModelOptions, Options):        # MODULE:FUNCTION, --input-shape, --classes
        strategies: tuple[str, ...] = strategy_names(("single", "ddp"), help="strategies to time")
        devices: tuple[int, ...] = device_counts((1, 2))

ModelOptions: `mgpu check`, `bench`, `gate`, calibrate. ReportOptions: the check commands' --json,
--strict and --accept-not-verified (mgpu/check/command.py ends them). `strategy_names` and
`device_counts` are the --strategies and --devices of check, bench, gate and calibrate: one converter
and one check each, every command its own default.

A leaf beside mgpu/options.py: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpu.names import STRATEGY_NAMES
from mgpu.errors import EXIT_NOT_VERIFIED
from mgpu.options import Options, comma_list, option, whole_number

__all__ = ["ModelOptions", "ReportOptions", "strategy_names", "device_counts", "known_strategies", "positive_counts"]


@dataclass(frozen=True, kw_only=True)
class ModelOptions(Options):
    """The model a command runs: a function returning an nn.Module or an mgpu.ModelSpec."""

    model: str = option(positional=True, metavar="MODULE:FUNCTION", pytest=False,
                        help="a function (in a module, or a .py file) returning an nn.Module or an mgpu.ModelSpec")
    input_shape: str | None = option(None, metavar="C,H,W", pytest=False,
                                     help="one input image, for a function returning an nn.Module")
    classes: int | None = option(None, text=whole_number, pytest=False,
                                 help="class count (default: read off the model's output)")


@dataclass(frozen=True, kw_only=True)
class ReportOptions(Options):
    """How a check command reports: --json, --strict, --accept-not-verified."""

    json: str | None = option(None, metavar="PATH", help="write the report as JSON here")
    strict: bool = option(False, help="findings fail too (exit 1)")
    accept_not_verified: bool = option(False, help=f"NOT VERIFIED (nothing differed, but too little was compared to "
                                                   f"say so) exits 0 instead of {EXIT_NOT_VERIFIED}")


def known_strategies(value: tuple, flag: str, error: type[Exception]) -> tuple:
    """A check: at least one strategy, each one mgpu has."""
    unknown = [s for s in value if s not in STRATEGY_NAMES]
    if unknown or not value:
        raise error(f"{flag}: unknown strategy {unknown[0] if unknown else ','.join(value)!r}: choose from "
                    f"{', '.join(STRATEGY_NAMES)}")
    return tuple(value)


def positive_counts(value: tuple, flag: str, error: type[Exception]) -> tuple:
    """A check: at least one count, each a positive integer."""
    if not value or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in value):
        raise error(f"{flag} must be positive, got {value}")
    return tuple(value)


def strategy_names(default: tuple[str, ...], help: str = "strategies, from " + ",".join(STRATEGY_NAMES)):
    """--strategies S[,S...]: a field of names, checked against mgpu's strategies."""
    return option(default, metavar="S[,S...]", help=help, text=comma_list(str, empty_ok=True),
                  check=known_strategies, pytest=False)


def device_counts(default: tuple[int, ...], help: str = "device counts (emulated on the CPU without GPUs)"):
    """--devices N[,N...]: a field of positive counts."""
    return option(default, metavar="N[,N...]", help=help, pytest=False,
                  text=comma_list(int, "comma-separated positive integers such as 1,2"), check=positive_counts)
