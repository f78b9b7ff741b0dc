"""The option mechanism (mgpu/options.py): one declaration becomes the argparse flag, the pytest
option with its prefix, the frozen options object (converted, checked, validated) and command-line
text again.

    pytest correctness/test_options.py
"""

from __future__ import annotations

import argparse
from dataclasses import FrozenInstanceError, dataclass

import pytest

from mgpu.errors import ConfigError
from mgpu.options import Options, at_least, comma_list, option, whole_number


class DemoError(ConfigError):
    pass


@dataclass(frozen=True, kw_only=True)
class Demo(Options):
    error = DemoError
    model: str = option(help="the model", positional=True, metavar="MODULE:FUNCTION")
    batch: int = option(32, help="examples per device", text=whole_number, check=at_least(1))
    devices: tuple[int, ...] = option((1, 2), help="device counts", metavar="N[,N...]",
                                      text=comma_list(int, "comma-separated integers such as 1,2"))
    amp: str = option("off", help="autocast", choices=("off", "bf16"))
    compile: bool = option(False, help="compile the model")
    progress: bool = option(True, help="hide the bar", flag="--no-progress", store_false=True, pytest=False)
    derived: int = 0  # no option: the object's own

    def validate(self) -> "Demo":
        if self.batch < max(self.devices):
            raise DemoError(f"--batch {self.batch} is smaller than {max(self.devices)} devices")
        return self


def _parser(prefix: str = "", **kw) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    Demo.add_to(p.add_argument, prefix=prefix, **kw)
    return p


def test_the_command_line_reads_into_a_frozen_checked_object_and_writes_back_to_the_same_text():
    args = _parser().parse_args(["m:f", "--batch", "64", "--devices", "1,2,4", "--compile", "--no-progress"])
    options = Demo.from_namespace(args)
    assert options == Demo(model="m:f", batch=64, devices=(1, 2, 4), compile=True, progress=False), options
    with pytest.raises(FrozenInstanceError):
        options.batch = 1
    argv = options.to_argv()
    assert argv == ["m:f", "--batch", "64", "--devices", "1,2,4", "--compile", "--no-progress"], argv
    assert Demo.from_namespace(_parser().parse_args(argv)) == options, "to_argv then read gave another object"


def test_defaults_are_declared_once_and_left_out_of_the_text():
    options = Demo.from_namespace(_parser().parse_args(["m:f"]))
    assert (options.batch, options.devices, options.amp, options.progress) == (32, (1, 2), "off", True)
    assert options.to_argv() == ["m:f"], options.to_argv()
    assert Demo(model="m").to_argv(every=True) == ["m", "--batch", "32", "--devices", "1,2", "--amp", "off"]


@pytest.mark.parametrize("argv, message", [
    (["m", "--batch", "0"], "--batch must be an integer >= 1, got 0"),
    (["m", "--batch", "lots"], "--batch must be an integer >= 1, got 'lots'"),
    (["m", "--devices", "1,x"], "--devices must be comma-separated integers such as 1,2, got '1,x'"),
    (["m", "--amp", "fp8"], "--amp must be one of off, bf16, got 'fp8'"),
    (["m", "--batch", "1"], "--batch 1 is smaller than 2 devices"),
])
def test_a_bad_value_is_the_classs_error_naming_the_flag(argv, message):
    with pytest.raises(DemoError) as caught:
        Demo.from_namespace(_parser().parse_args(argv))
    assert str(caught.value) == message


def test_the_pytest_form_has_the_prefix_in_flags_messages_and_text_and_no_arguments():
    parser = _parser("ab-", pytest=True, show_defaults=True)
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"]
    assert flags == ["--ab-batch", "--ab-devices", "--ab-amp", "--ab-compile"], flags
    assert "(default 32)" in parser.format_help()
    with pytest.raises(DemoError, match="^--ab-batch must be an integer >= 1, got 0$"):
        Demo.from_namespace(parser.parse_args(["--ab-batch", "0"]), prefix="ab-", model="m", progress=True)
    options = Demo.from_namespace(parser.parse_args(["--ab-batch", "8", "--ab-compile"]), prefix="ab-", model="m",
                                  progress=True)
    assert options.to_argv(prefix="ab-", leave_out=("model",)) == ["--ab-batch", "8", "--ab-compile"]


def test_typed_values_given_directly_are_checked_the_same_way():
    with pytest.raises(DemoError, match="--batch must be an integer >= 1, got True"):
        Demo.read(lambda name: {"model": "m", "batch": True}.get(name, Demo.default_of(name)))


# -- what the gate and history need (issue 58): a group of options inside another class, an optional
# argument with its default, the prefix in a help line, and percentages as fractions -----------------

from mgpu.options import number_in, options_group, percent, percent_shown, shortest  # noqa: E402


@dataclass(frozen=True, kw_only=True)
class Inner(Options):
    error = DemoError
    threshold: float = option(0.10, metavar="PERCENT", show=percent_shown,
                              text=percent("a percentage in (0, 100)", lambda x: 0 < x < 100),
                              help="catch this, within --{prefix}budget-s")
    budget_s: float = option(120.0, show=shortest, text=number_in("a number of seconds > 0", lambda x: x > 0),
                             help="seconds")
    strict: bool = option(False, help="strict")


@dataclass(frozen=True, kw_only=True)
class Outer(Options):
    error = DemoError
    storage: str = option(".benchmarks", positional=True, nargs="?", metavar="STORAGE", help="the runs")
    baseline: str | None = option(None, metavar="REF", help="the baseline")
    inner: Inner = options_group(Inner)
    out: str = option("out", help="the folder")


def test_a_group_is_offered_read_and_written_in_its_place_with_the_prefix_in_its_help():
    parser = argparse.ArgumentParser(exit_on_error=False)
    Outer.add_to(parser.add_argument, show_defaults=True)
    flags = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions if a.dest != "help"]
    assert flags == ["storage", "--baseline", "--threshold", "--budget-s", "--strict", "--out"], flags
    assert "within --budget-s (default 10)" in " ".join(parser.format_help().split())
    assert "the runs (default .benchmarks)" in " ".join(parser.format_help().split())
    options = Outer.from_namespace(parser.parse_args(["--threshold", "5%", "--budget-s", "60", "--strict"]))
    assert options == Outer(inner=Inner(threshold=0.05, budget_s=60.0, strict=True)), options
    assert options.to_argv() == [".benchmarks", "--threshold", "5", "--budget-s", "60", "--strict"], options.to_argv()
    assert Outer.from_namespace(parser.parse_args(options.to_argv())) == options
    with pytest.raises(DemoError, match=r"^--threshold must be a percentage in \(0, 100\), got '100'$"):
        Outer.from_namespace(parser.parse_args(["--threshold", "100"]))
    pytest_form = argparse.ArgumentParser()
    Inner.add_to(pytest_form.add_argument, prefix="ab-", pytest=True, show_defaults=True)
    assert "within --ab-budget-s" in " ".join(pytest_form.format_help().split())
    with pytest.raises(DemoError, match=r"^--ab-budget-s must be a number of seconds > 0, got '0'$"):
        Inner.from_namespace(pytest_form.parse_args(["--ab-budget-s", "0"]), prefix="ab-")


def test_only_leave_out_and_defaults_reach_into_the_group():
    parser = argparse.ArgumentParser()
    Outer.add_to(parser.add_argument, only=("baseline", "threshold"), defaults={"threshold": "20"}, show_defaults=True)
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"]
    assert flags == ["--baseline", "--threshold"], flags
    options = Outer.from_namespace(parser.parse_args([]), only=("baseline", "threshold"))
    assert options.inner == Inner(threshold=0.20), options


def test_values_without_a_parser_and_numbers_shown_as_they_read_back():
    assert Inner.from_values({"threshold": "7.5"}) == Inner(threshold=0.075)
    assert Inner.from_values() == Inner()
    for fraction in (0.05, 0.1, 0.015, 0.073456789, 0.2):  # each a percentage as typed, over 100
        assert float(percent_shown(fraction)) / 100 == fraction, fraction
    assert (percent_shown(0.05), shortest(120.0), shortest(0.25), shortest(7)) == ("5", "120", "0.25", "7")


def test_a_subclass_declares_an_inherited_option_again_with_another_default_and_nothing_else():
    @dataclass(frozen=True, kw_only=True)
    class Later(Demo):
        model: str | None = Demo.option_of("model", None)  # the same argument, help and metavar

    assert Later(batch=8).model is None, "constructed without the model"
    parser = argparse.ArgumentParser(exit_on_error=False)
    Later.add_to(parser.add_argument)
    assert [a.metavar for a in parser._actions if a.dest == "model"] == ["MODULE:FUNCTION"]
    with pytest.raises(SystemExit):  # still a required argument on the command line
        parser.parse_args([])
    assert Later.from_namespace(parser.parse_args(["m:f"])) == Later(model="m:f")
    assert [f.name for f, _ in Later.declared()] == [f.name for f, _ in Demo.declared()], "the field moved"


def test_a_list_converter_may_word_its_whole_message():
    counts = comma_list(int, message="argument {flag}: expected rank counts like 1,2, got {text!r}", empty_ok=True)
    assert counts("2, 1", "--devices", DemoError) == (2, 1) and counts(",", "--devices", DemoError) == ()
    with pytest.raises(DemoError, match=r"^argument --devices: expected rank counts like 1,2, got '1,x'$"):
        counts("1,x", "--devices", DemoError)
    with pytest.raises(DemoError, match=r"^argument --ranks: expected rank counts like 1,2, got ''$"):
        comma_list(int, message="argument {flag}: expected rank counts like 1,2, got {text!r}")("", "--ranks", DemoError)
