"""mgpu's own commands (train, check, check-script) declare each option once, on their options classes
(mgpu/options.py's `option`): their parsers are made from the declarations and read back into the
classes' defaults, and a bad value still gets its validate()'s message.

    pytest correctness/test_cli_options.py
"""

from __future__ import annotations

from dataclasses import replace

import pytest


def _mgpu(*argv):
    from mgpu.cli import build_parser

    return build_parser().parse_args(list(argv))


def test_mgpus_commands_parse_their_defaults_into_the_option_classes_defaults():
    from mgpu.check.script.command import ScriptArguments
    from mgpu.check.script.plan import ScriptCheckOptions, Target
    from mgpu.config import CheckOptions, TrainConfig
    from mgpu.option_groups import ReportOptions

    assert TrainConfig.from_namespace(_mgpu("train")) == TrainConfig()
    assert CheckOptions.from_namespace(_mgpu("check", "lenet")) == CheckOptions()
    args = _mgpu("check-script", "train.py", "--batch-size", "{64 // world_size}")
    assert ScriptCheckOptions.from_namespace(args) == ScriptCheckOptions().validate()
    assert ScriptArguments.from_namespace(args).target() == Target("train.py", None, ("--batch-size", "{64 // world_size}"))
    assert ReportOptions.from_namespace(args) == ReportOptions()


def test_a_train_config_written_as_text_reads_back_equal():
    from mgpu.config import TrainConfig

    cfg = TrainConfig(strategy="ddp", devices=2, lr=0.2, progress=False, resize=28, sync_bn=True, out=None)
    argv = cfg.to_argv()
    assert argv[:4] == ["--strategy", "ddp", "--devices", "2"] and "--no-progress" in argv, argv
    assert TrainConfig.from_namespace(_mgpu("train", *argv, "--out", "")) == replace(cfg, out="")


@pytest.mark.parametrize("argv, message", [
    (["train", "--epochs", "2.5"], "epochs must be a positive integer, got 2.5"),
    (["train", "--batch-size", "lots"], "batch size must be a positive integer, got 'lots'"),
    (["check", "m:f", "--devices", "two"], "--devices must be comma-separated integers such as 2,3, got 'two'"),
    (["check", "m:f", "--strategies", ""], "no strategies to check"),
    (["check", "m:f", "--step-timeout", "soon"], "step timeout must be a positive number of seconds, got 'soon'"),
    (["check-script", "--steps", "0", "t.py"], "--steps must be a positive integer, got '0'"),
    (["check-script", "--ranks", "1,two", "t.py"], "--ranks must be comma-separated world sizes such as 1,2, got '1,two'"),
])
def test_mgpus_bad_option_values_keep_their_validates_messages(argv, message):
    from mgpu.check.script.plan import ScriptCheckOptions
    from mgpu.config import CheckOptions, TrainConfig

    cls = {"train": TrainConfig, "check": CheckOptions, "check-script": ScriptCheckOptions}[argv[0]]
    with pytest.raises(cls.error) as caught:
        cls.from_namespace(_mgpu(*argv))
    assert str(caught.value) == message
