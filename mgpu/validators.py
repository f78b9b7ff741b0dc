"""The checks of option values, written once: every command's options object (train's TrainConfig,
check's CheckOptions, check-script's ScriptCheckOptions, the gate's Settings) and every function that
takes a count validates with these, so that one message reads the same wherever it comes from.

    positive_int(batch_size, "batch size")                    # ConfigError naming "batch size" and the value
    positive_int(steps, "--steps", error=ScriptCheckError)    # another mgpu error class, the same words
    number(text, "--ab-sample-s", "a number of seconds in (0, 60]", lambda v: 0 < v <= 60, error=GateError)

A leaf: it imports only mgpu.errors (no torch), so any module may use it.
"""

from __future__ import annotations

import math
from typing import Callable

from mgpu.errors import ConfigError

__all__ = ["is_int", "positive_int", "non_negative_int", "finite_number", "number", "one_of", "world_sizes", "int_or_text",
           "float_or_text", "choices_metavar"]


def is_int(value) -> bool:
    """An int that is not a bool (True is an int to Python, never a count to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value, name: str, error: type[Exception] = ConfigError) -> int:
    """`value` when it is an int >= 1 (not a bool), else `error` naming it and the value."""
    if not is_int(value) or value < 1:
        raise error(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(value, name: str, error: type[Exception] = ConfigError) -> int:
    if not is_int(value) or value < 0:
        raise error(f"{name} must be a non-negative integer, got {value!r}")
    return value


def finite_number(value, name: str, lowest: float, inclusive: bool, error: type[Exception] = ConfigError) -> float:
    """A finite int or float >= lowest (> lowest when not inclusive)."""
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok_type or not math.isfinite(value) or value < lowest or (value == lowest and not inclusive):
        bound = f">= {lowest:g}" if inclusive else f"> {lowest:g}"
        raise error(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def number(text, name: str, what: str, ok: Callable[[float], bool], error: type[Exception] = ConfigError) -> float:
    """A finite number from option text (or a number) that `ok` accepts, else '{name} must be {what}, got ...'."""
    try:
        value = float(str(text))
    except ValueError:
        raise error(f"{name} must be {what}, got {text!r}") from None
    if not (math.isfinite(value) and ok(value)):
        raise error(f"{name} must be {what}, got {text!r}")
    return value


def one_of(value, name: str, choices, error: type[Exception] = ConfigError) -> str:
    if value not in choices:
        raise error(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def world_sizes(text, name: str = "--ranks", error: type[Exception] = ConfigError) -> tuple[int, ...]:
    """World sizes from '1,2' (or a sequence of ints): each a positive integer, at least one."""
    parts = [p for p in text.split(",") if p.strip()] if isinstance(text, str) else list(text)
    try:
        sizes = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise error(f"{name} must be comma-separated world sizes such as 1,2, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise error(f"{name} must be positive world sizes such as 1,2, got {text!r}")
    return sizes


# Command lines parse options into numbers with these and check them in the options object's validate(),
# which holds every rule and message: text that is no number is handed on as it is, so that `--epochs 2.5`,
# `--batch-size lots` and TrainConfig(epochs=2.5, batch_size="lots") get the same message.
def int_or_text(text: str) -> int | float | str:
    """An integer when the text is one; else the number or the text itself, for validate() to reject."""
    try:
        return int(text)
    except ValueError:
        return float_or_text(text)


def float_or_text(text: str) -> float | str:
    """A float when the text is a number ('nan' and 'inf' included); else the text itself."""
    try:
        return float(text)
    except ValueError:
        return text


def choices_metavar(names: tuple[str, ...]) -> str:
    return "{" + ",".join(names) + "}"  # the metavar argparse shows for `choices`
