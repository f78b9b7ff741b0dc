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
