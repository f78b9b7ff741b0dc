"""One way to declare a command's option: a field of a dataclass, declared once with `option(...)`
(name, type, default, help, check), that becomes the argparse flag, the pytest option where there is
one, a field of the frozen, validated options object, and, back again, command-line text.

    @dataclass(frozen=True, kw_only=True)
    class BenchOptions(Options):
        error = ConfigError                       # what a bad value raises (one line, naming the flag)
        batch: int = option(32, help="examples per device", text=whole_number, check=at_least(1))
        strategies: tuple[str, ...] = option(("single",), text=comma_list(str), metavar="S[,S...]", help="...")

    BenchOptions.add_to(parser.add_argument)                  # --batch, --strategies (argparse)
    BenchOptions.add_to(group.addoption, prefix="ab-")        # --ab-batch ... (pytest)
    options = BenchOptions.from_namespace(args)               # text -> values -> checks -> frozen object
    argv = options.to_argv()                                  # ["--batch", "64"]: what another process parses back

The command line stores text; `from_namespace` (or `read`) turns each value with its option's `text`
converter and then runs its `check`, both naming the flag as that front end spells it (`--ab-threshold`
in the plugin, `--threshold` in `mgpu gate`); the class's own `validate()` then checks what spans
fields. A converter or check raises `cls.error`; a command turns it into its one-line error (exit 2).
The one list converter is `comma_list`.

A leaf: it imports only mgpu.errors and mgpu.validators (no torch), so a command can read its options
before it imports anything heavy, and the pytest plugin can import it in every run.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar

from mgpu.errors import ConfigError
from mgpu.validators import is_int, number, positive_int

__all__ = ["Option", "option", "options_group", "Options", "comma_list", "whole_number", "number_text", "choice",
           "at_least", "number_in", "percent", "shortest", "percent_shown", "REMAINDER"]

REMAINDER = argparse.REMAINDER
_KEY = "mgpu.option"
_GROUP = "mgpu.options_group"


@dataclass(frozen=True)
class Option:
    """One option's declaration (the metadata of its field). `text(value, flag, error)` turns command-line
    text into the field's value (applied to text only: a default already of the field's type passes as
    it is); `check(value, flag, error)` raises `error` naming `flag` when the value is wrong; `show(value)`
    writes a value back as command-line text (str by default). `flag`: the option's name on the command
    line when it is not the field's (`--no-progress` for `progress`); `positional`: an argument, not a
    flag; `pytest`: whether the pytest plugin offers it (with its prefix)."""

    help: str = ""
    metavar: str | None = None
    text: Callable | None = None
    check: Callable | None = None
    show: Callable[[Any], str] = str
    flag: str | None = None
    positional: bool = False
    nargs: Any = None
    store_false: bool = False      # a flag that turns the field off (--no-progress)
    pytest: bool = True
    choices: tuple | None = None   # shown as the metavar {a,b}; checked by `choice(...)` where given


def option(default: Any = MISSING, *, default_factory: Any = MISSING, **declaration) -> Any:
    """A dataclass field that is a command-line option: `default` and the keywords of Option."""
    spec = Option(**declaration)
    if spec.choices and spec.metavar is None:
        spec = dataclasses.replace(spec, metavar="{" + ",".join(spec.choices) + "}")
    if spec.choices and spec.check is None:
        spec = dataclasses.replace(spec, check=choice(spec.choices))
    return field(default=default, default_factory=default_factory, metadata={_KEY: spec})


def options_group(group: type) -> Any:
    """A field holding another Options class's object, whose options this class offers in the field's
    place (declared once, in `group`): add_to adds them there, read reads them (the group's converters,
    checks and validate()) into the field, to_argv writes them there. Its options take the same prefix,
    `leave_out`, `only` and `defaults` (by the group's field names); a group has no positional argument.

        settings: Settings = options_group(Settings)      # the gate's options inside `mgpu gate`'s
    """
    return field(default_factory=group, metadata={_GROUP: group})


class Options:
    """The options of one command, a dataclass whose option fields were declared with `option(...)`.
    Fields without `option(...)` are the object's own (derived or fixed values, not on a command line)."""

    error: ClassVar[type[Exception]] = ConfigError

    # -- the declaration, read back --------------------------------------------------------------
    @classmethod
    def declared(cls, leave_out=(), only=None) -> list[tuple[dataclasses.Field, Option]]:
        """(field, Option) of each option field, in declaration order (a group's own options aside)."""
        chosen = []
        for f in fields(cls):
            spec = f.metadata.get(_KEY)
            if spec is None or f.name in leave_out or (only is not None and f.name not in only):
                continue
            chosen.append((f, spec))
        return chosen

    @classmethod
    def _members(cls, leave_out=(), only=None) -> list[tuple[dataclasses.Field, Option | None, type | None]]:
        """(field, Option, None) of each option field and (field, None, group class) of each group, in order."""
        members = []
        for f in fields(cls):
            if _GROUP in f.metadata:
                members.append((f, None, f.metadata[_GROUP]))
            elif _KEY in f.metadata and f.name not in leave_out and (only is None or f.name in only):
                members.append((f, f.metadata[_KEY], None))
        return members

    @classmethod
    def flag_of(cls, name: str, prefix: str = "") -> str:
        """The option of field `name` as a front end spells it: --ab-max-rounds, or `model` for an argument."""
        spec = dict((f.name, s) for f, s in cls.declared())[name]
        if spec.positional:
            return name
        if spec.flag and not prefix:
            return spec.flag  # as declared: --no-progress, or a short -m
        return "--" + prefix + (spec.flag or name.replace("_", "-")).lstrip("-")

    @classmethod
    def option_of(cls, name: str, default: Any = MISSING, **changes) -> Any:
        """Field `name`'s option declared again, for a subclass that gives it another default (or
        changes some keywords of Option): `model: str | None = ModelOptions.option_of("model", None)`."""
        spec = dict((f.name, s) for f, s in cls.declared())[name]
        return option(default, **{**dataclasses.asdict(spec), **changes})

    @classmethod
    def default_of(cls, name: str):
        f = next(f for f in fields(cls) if f.name == name)
        return f.default_factory() if f.default_factory is not MISSING else f.default

    # -- onto a command line ---------------------------------------------------------------------
    @classmethod
    def add_to(cls, add: Callable, prefix: str = "", leave_out=(), only=None, defaults: dict | None = None,
               show_defaults: bool = False, pytest: bool = False) -> None:
        """Every option through `add` (argparse's add_argument, a group's, or pytest's addoption), as
        --{prefix}NAME. `defaults` overrides some; `show_defaults` writes the default into the help
        (argparse's ArgumentDefaultsHelpFormatter does it itself); `pytest`: only the options the plugin
        offers, and no positional arguments."""
        defaults = defaults or {}
        for f, spec, group in cls._members(leave_out, only):
            if group is not None:
                group.add_to(add, prefix=prefix, leave_out=leave_out, only=only, defaults=defaults,
                             show_defaults=show_defaults, pytest=pytest)
                continue
            if pytest and (not spec.pytest or spec.positional):
                continue
            default = defaults.get(f.name, cls.default_of(f.name))
            kwargs: dict[str, Any] = {"help": spec.help.replace("{prefix}", prefix)}
            if spec.positional:
                if spec.nargs:
                    kwargs["nargs"] = spec.nargs
                if default is not MISSING:  # an optional argument (nargs "?"): its default, as text
                    shown = _as_text(default, spec)
                    kwargs["default"] = shown
                    if show_defaults and shown not in (None, ""):
                        kwargs["help"] += f" (default {shown})"
                add(f.name, metavar=spec.metavar, **kwargs)
                continue
            name = cls.flag_of(f.name, prefix)
            if default is False or spec.store_false:
                add(name, dest=prefix.replace("-", "_") + f.name,
                    action="store_false" if spec.store_false else "store_true", **kwargs)
                continue
            shown = _as_text(default, spec)
            if show_defaults and shown not in (None, ""):
                kwargs["help"] += f" (default {shown})"
            if spec.nargs:
                kwargs["nargs"] = spec.nargs
            add(name, dest=prefix.replace("-", "_") + f.name, default=shown if isinstance(shown, str) else default,
                metavar=spec.metavar, **kwargs)

    # -- from a command line ---------------------------------------------------------------------
    @classmethod
    def read(cls, get: Callable[[str], Any], prefix: str = "", leave_out=(), only=None, **fixed):
        """The options from a front end's values: get(name) gives the value of field `name` (its text
        as typed, or its default); fields left out (or not in `only`) keep their defaults; `fixed` sets
        some directly. Each text goes through its option's converter, then its check, naming the flag
        with `prefix`; a group's options are read by its class, in the group's place; then the class's
        validate(). Raises cls.error, one line."""
        values = {}
        for f, spec, group in cls._members(leave_out, only):
            if f.name in fixed:
                continue
            if group is not None:
                values[f.name] = group.read(get, prefix=prefix, leave_out=leave_out, only=only)
                continue
            values[f.name] = cls._value(f.name, spec, get(f.name), prefix)
        made = cls(**values, **fixed)
        validate = getattr(made, "validate", None)
        return validate() if validate is not None else made

    @classmethod
    def from_namespace(cls, args: argparse.Namespace, prefix: str = "", leave_out=(), only=None, **fixed):
        """`read` from argparse's namespace (the dests `add_to` gave)."""
        dest = prefix.replace("-", "_")
        return cls.read(lambda name: getattr(args, dest + name), prefix=prefix, leave_out=leave_out, only=only,
                        **fixed)

    @classmethod
    def from_values(cls, values: dict | None = None, prefix: str = "", **fixed):
        """`read` from values by field name, as a command line would give them (text, such as
        threshold="5%", or typed values); the others their defaults. For a caller without a parser."""
        values = values or {}
        return cls.read(lambda name: values.get(name, cls.default_of(name)), prefix=prefix, **fixed)

    @classmethod
    def _value(cls, name: str, spec: Option, value: Any, prefix: str):
        flag = cls.flag_of(name, prefix)
        if spec.text is not None and isinstance(value, str):
            value = spec.text(value, flag, cls.error)
        if spec.check is not None:
            value = spec.check(value, flag, cls.error)
        return value

    # -- back to a command line ------------------------------------------------------------------
    def to_argv(self, prefix: str = "", leave_out=(), every: bool = False) -> list[str]:
        """This object's options as command-line text that `read` turns back into an equal object:
        the options that differ from their defaults (every one with `every`), positional arguments
        first (argparse takes them in order)."""
        flags, positionals = [], []
        for f, spec, group in self._members(leave_out):
            value = getattr(self, f.name)
            if group is not None:
                flags += value.to_argv(prefix=prefix, leave_out=leave_out, every=every)
                continue
            if spec.positional:
                if isinstance(value, (list, tuple)) and spec.nargs not in (None, "?"):
                    positionals += [str(v) for v in value]  # nargs "*", "+", N: one argument each
                elif value is not None:
                    positionals.append(_as_text(value, spec))
                continue
            if not every and value == self.default_of(f.name):
                continue
            name = self.flag_of(f.name, prefix)
            if isinstance(value, bool) or spec.store_false:
                if bool(value) != bool(spec.store_false):
                    flags.append(name)
                continue
            if value is None:
                continue
            flags += [name, _as_text(value, spec)]
        return positionals + flags


def _as_text(value, spec: Option):
    """A value as command-line text: its option's `show`, a sequence comma-joined; None and bools as they are,
    and text too (a default given as text, `defaults={"workers": "2"}`)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (tuple, list)) and spec.show is str:
        return ",".join(map(str, value))
    return spec.show(value)


# -- converters (text -> value) and checks, each (value, flag, error) ---------------------------------

def comma_list(item: Callable[[str], Any] = str, what: str | None = None, empty_ok: bool = False,
               message: str | None = None) -> Callable:
    """The one list converter: "1,2" -> (1, 2) with `item` applied to each part (blank parts dropped);
    `what` names the expected text in the message: '--devices must be {what}, got '1,x''; `message`,
    where given, is the whole message instead, a format string of {flag} and {text}
    ("argument {flag}: expected rank counts like 1,2, got {text!r}")."""
    def convert(text: str, flag: str, error: type[Exception]) -> tuple:
        def bad() -> Exception:
            if message is not None:
                return error(message.format(flag=flag, text=text))
            return error(f"{flag} must be {what or 'a comma-separated list'}, got {text!r}")

        parts = [p.strip() for p in text.split(",") if p.strip()]
        try:
            values = tuple(item(p) for p in parts)
        except ValueError:
            raise bad() from None
        if not values and not empty_ok:
            raise bad()
        return values
    return convert


def whole_number(text: str, flag: str, error: type[Exception]):
    """An integer when the text is one; else the text itself, for the check to name as typed."""
    try:
        return int(text)
    except ValueError:
        return number_text(text, flag, error)


def number_text(text: str, flag: str, error: type[Exception]):
    """A float when the text is a number ('nan' and 'inf' included); else the text itself."""
    try:
        return float(text)
    except ValueError:
        return text


def choice(choices: tuple) -> Callable:
    def check(value, flag: str, error: type[Exception]):
        if value not in choices:
            raise error(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
        return value
    return check


def at_least(lowest: int) -> Callable:
    """A check: an integer (not a bool) >= lowest."""
    def check(value, flag: str, error: type[Exception]):
        if not is_int(value) or value < lowest:
            raise error(f"{flag} must be an integer >= {lowest}, got {value!r}")
        return value
    return check


def number_in(what: str, ok: Callable[[float], bool]) -> Callable:
    """A converter: a finite number from text that `ok` accepts, else '{flag} must be {what}, got '...''."""
    def convert(text: str, flag: str, error: type[Exception]) -> float:
        return number(text, flag, what, ok, error=error)
    return convert


def percent(what: str, ok: Callable[[float], bool]) -> Callable:
    """A converter: a percentage as text ("5%" or "5") that `ok` accepts, as a fraction (0.05); else
    '{flag} must be {what}, got '...''. Its `show` is percent_shown."""
    def convert(text: str, flag: str, error: type[Exception]) -> float:
        return number(str(text).strip().rstrip("%"), flag, what, ok, error=error) / 100
    return convert


def shortest(value) -> str:
    """A number as the shortest text that reads back equal: 120.0 -> '120', 0.25 -> '0.25'."""
    if isinstance(value, float):
        for digits in range(6, 18):
            text = f"{value:.{digits}g}"
            if float(text) == value:
                return text
        return repr(value)
    return str(value)


def percent_shown(fraction: float) -> str:
    """A fraction as the percentage text `percent` reads back to it: 0.05 -> '5'."""
    for digits in range(6, 18):
        text = f"{fraction * 100:.{digits}g}"
        if float(text) / 100 == fraction:
            return text
    return repr(fraction * 100)
