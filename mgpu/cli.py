"""`python -m mgpu train ...`: the chapter's experiment; `python -m mgpu check ...`: your model's parity;
`python -m mgpu check-script ...`: your own training loop's parity.

    python -m mgpu train --model lenet --epochs 2 --train-size 8192 --test-size 2000
    python -m mgpu train --strategy ddp --devices 2 --batch-size 512 --lr 0.2
    python -m mgpu check examples/tiny_lm.py:spec --json check.json
    python -m mgpu check torchvision.models:resnet18 --input-shape 3,32,32 --classes 10
    python -m mgpu check-script --ranks 1,2 --steps 4 train.py --batch-size "{64 // world_size}"
    python -m mgpu bench examples/tiny_lm.py:spec --devices 1,2          # your model's step, timed
    python -m mgpu gate mymodel.py:spec --baseline origin/main           # the A/B gate (docs/guide/gate.md)
    python -m mgpu history .benchmarks --html history.html               # saved runs over commits (docs/guide/history.md)

Every mistake a user can make ends in one line on stderr, `mgpu: error: ...`, and exit code 2.
Exit codes (mgpu/errors.py assigns them; docs/guide/failures.md lists every case):

    0    the run finished; check, check-script: PASSED (findings do not count unless --strict:
         docs/guide/check.md), or NOT VERIFIED with --accept-not-verified;
         gate: no benchmark `slower` (nor `inconclusive` with --strict)
    1    the run failed while training: a rank failed (its error is shown), or a NaN/Inf loss;
         check, check-script: FAILED (the first divergence is shown), with --strict also a finding;
         bench: a case failed; gate: a benchmark is `slower`, or a workload failed in an arm (named)
    2    bad input: a wrong option, missing or corrupt data, an unwritable folder, a bad checkpoint
    3    check, check-script: NOT VERIFIED: nothing differed, but too little was compared to say so
         (comparisons skipped, an unseeded script, gradients all zero)
    4    history: a suspected slowdown that no gate confirmed (1: one the A/B gate confirmed, --confirm)
    6    the counted baseline (pytest --counts-check FILE): an entry of another torch or device
    130  interrupted by Ctrl-C (SIGINT); 143 stopped by SIGTERM; every rank is stopped first
"""

from __future__ import annotations

import argparse
import sys

from mgpu.config import TrainConfig
from mgpu.errors import EXIT_OK, ConfigError, LaunchError, NonFiniteLossError, OneLineParser, end_command, one_line

# Commands other packages add (mgpu_perf adds `bench` and `gate`): modules named by the entry-point
# group COMMANDS_GROUP, or, for a checkout used without installing it (`PYTHONPATH=.`), in the
# COMMANDS_ENV variable, comma-separated, as pytest reads PYTEST_PLUGINS. Each module has
# `add_commands(commands) -> {name: main(parser, args) -> exit code}`; mgpu imports none by name.
COMMANDS_GROUP = "mgpu.commands"
COMMANDS_ENV = "MGPU_COMMANDS"
# Commands a provider adds, for the one-line answer when it is not there (a checkout used without install).
PROVIDED_ELSEWHERE = {"bench": "mgpu_perf.cli", "gate": "mgpu_perf.cli", "history": "mgpu_perf.cli"}


def config_or_exit(parser: argparse.ArgumentParser, **fields) -> TrainConfig:
    """TrainConfig(**fields), validated; a bad setting ends the program through `parser.error`
    with TrainConfig.validate's message (for OneLineParser: `mgpu: error: ...`, exit code 2).

    Any command that builds a TrainConfig from its options uses this, so that its rules and
    messages are the API's. Imports nothing heavy: call it before importing torch.
    """
    try:
        return TrainConfig(**fields).validate()
    except ConfigError as e:
        parser.error(one_line(e))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="mgpu", allow_abbrev=False, description="Data-parallel training, checked against one device.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    _add_train_parser(commands)
    _add_check_parser(commands)
    _add_check_script_parser(commands)
    parser.set_defaults(command_mains={"check": _check_main, "check-script": _check_script_main})
    for add_commands in _command_providers():
        parser.get_default("command_mains").update(add_commands(commands))
    return parser


def _add_train_parser(commands) -> None:
    t = commands.add_parser("train", allow_abbrev=False, help="train a model and print the chapter's line",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    TrainConfig.add_to(t.add_argument)  # every option declared once, on TrainConfig's fields (mgpu/config.py)


def _add_check_script_parser(commands) -> None:
    from mgpu.check.script.command import add_arguments

    p = commands.add_parser("check-script", allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="run your own training script at world size 1 and at N ranks and find the first "
                                 "optimizer step where they part (docs/guide/check-script.md)")
    add_arguments(p)


def _check_script_main(parser: argparse.ArgumentParser, args) -> int:
    from mgpu.check.script.command import run_main

    return run_main(parser, args)


def _command_providers() -> list:
    """Each provider's `add_commands` (see COMMANDS_GROUP), the installed ones and those in COMMANDS_ENV,
    once each. A provider that cannot be imported is skipped: its commands are then unknown (exit 2)."""
    import importlib
    import importlib.metadata
    import os

    names = [ep.value for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP)]
    names += [n.strip() for n in os.environ.get(COMMANDS_ENV, "").split(",") if n.strip()]
    providers = []
    for name in dict.fromkeys(names):
        try:
            providers.append(importlib.import_module(name).add_commands)
        except (ImportError, AttributeError):
            continue
    return providers


def _add_check_parser(commands) -> None:
    from mgpu.check.model.command import add_arguments

    p = commands.add_parser("check", allow_abbrev=False, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            help="check that data-parallel training of your model computes what one device computes")
    add_arguments(p)


def _check_main(parser: argparse.ArgumentParser, args) -> int:
    from mgpu.check.model.command import run_main

    return run_main(parser, args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    missing = PROVIDED_ELSEWHERE.get(argv[0]) if argv and argv[0] not in parser.get_default("command_mains") else None
    if missing and argv[0] != "train":
        parser.error(f"'{argv[0]}' is added by {missing.split('.')[0]}, which this Python does not have installed: "
                     f"pip install -e . (or, in a checkout, {COMMANDS_ENV}={missing} python -m mgpu {argv[0]} ..., "
                     f"or python -m {missing.split('.')[0]} {argv[0]} ...)")
    args = parser.parse_args(argv)
    command_main = args.command_mains.get(args.command)
    if command_main is not None:
        return command_main(parser, args)
    try:
        cfg = TrainConfig.from_namespace(args)  # text -> numbers -> validate(): its rules and messages
    except ConfigError as e:
        parser.error(one_line(e))
    from mgpu.startup import imports_uncollected

    with imports_uncollected():
        from mgpu.run import train  # after checking: `--help`, typos and bad values answer without importing torch

    def run() -> int:
        train(cfg)
        return EXIT_OK

    return end_command(run, failures=(LaunchError, NonFiniteLossError))
