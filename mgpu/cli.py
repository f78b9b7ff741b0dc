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

from mgpu.config import (AMP_MODES, DATA_NAMES, DEVICE_KINDS, EXACT_GPU_MATH_ENV, MODEL_NAMES,
                         NONFINITE_POLICIES, RESHARD_MODES, SHARD_MODES, STRATEGY_NAMES, TrainConfig)
from mgpu.validators import choices_metavar, float_or_text, int_or_text
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
    d = TrainConfig()
    t.add_argument("--strategy", metavar=choices_metavar(STRATEGY_NAMES), default=d.strategy, help="how to spread the work")
    t.add_argument("--devices", type=int_or_text, default=d.devices,
                   help="devices (replicas, or ranks for ddp and fsdp); emulated on the CPU when GPUs are short")
    t.add_argument("--require-gpus", action="store_true", help="fail instead of emulating missing GPUs")
    t.add_argument("--device", metavar=choices_metavar(DEVICE_KINDS), default=d.device,
                   help="auto: GPUs when there are --devices of them, else the CPU; cpu: the CPU even beside GPUs; "
                        "cuda: GPUs or an error (as --require-gpus)")
    t.add_argument("--exact-gpu-math", action="store_true",
                   help=f"TF32 off and cuDNN's deterministic algorithms in every process of the run, for results "
                        f"another run can be compared with (also: {EXACT_GPU_MATH_ENV}=1); no effect on the CPU")
    t.add_argument("--epochs", type=int_or_text, default=d.epochs)
    t.add_argument("--batch-size", type=int_or_text, default=d.batch_size, help="global batch size")
    t.add_argument("--lr", type=float_or_text, default=d.lr, help="learning rate")
    t.add_argument("--momentum", type=float_or_text, default=d.momentum)
    t.add_argument("--weight-decay", type=float_or_text, default=d.weight_decay)
    t.add_argument("--model", metavar=choices_metavar(MODEL_NAMES), default=d.model)
    t.add_argument("--width", type=int_or_text, default=d.width, help="ResNet-18 base width")
    t.add_argument("--data", metavar=choices_metavar(DATA_NAMES), default=d.data)
    t.add_argument("--data-dir", default=d.data_dir, help="folder with FashionMNIST/raw/ (torchvision layout)")
    t.add_argument("--download", action="store_true", help="download Fashion-MNIST if it is missing")
    t.add_argument("--resize", type=int_or_text, default=None, help="resize images to this side")
    t.add_argument("--train-size", type=int_or_text, default=None, help="use the first N training examples")
    t.add_argument("--test-size", type=int_or_text, default=None, help="use the first N test examples")
    t.add_argument("--seed", type=int_or_text, default=d.seed)
    t.add_argument("--out", default=d.out, help="folder for results.json, accuracy.png and model.pt")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    t.add_argument("--on-nonfinite", metavar=choices_metavar(NONFINITE_POLICIES), default=d.on_nonfinite,
                   help="on a NaN/Inf loss: stop with an error, or skip that step's update")
    t.add_argument("--port", type=int_or_text, default=None,
                   help="ddp rendezvous port (default: a free one, chosen per run)")
    t.add_argument("--timeout", type=float_or_text, default=d.timeout,
                   help="ddp: seconds a rank waits for the others")
    t.add_argument("--sync-bn", action="store_true", help="ddp: use SyncBatchNorm (CUDA only)")
    t.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="save model, optimizer, RNG states and epoch to DIR/checkpoint.pt after every epoch")
    t.add_argument("--amp", metavar=choices_metavar(AMP_MODES), default=d.amp,
                   help="bf16: autocast forward and loss to bfloat16 (weights and SGD stay fp32)")
    t.add_argument("--channels-last", action="store_true", help="channels-last memory layout for images and convolutions")
    t.add_argument("--compile", action="store_true",
                   help="the training forward under torch.compile (inductor; the DDP or FSDP wrapper compiled with it)")
    t.add_argument("--data-on-device", action="store_true",
                   help="CUDA: hold the whole dataset on the first device, shuffle and gather there (no-op on the CPU)")
    t.add_argument("--accumulate", type=int_or_text, default=d.accumulate, metavar="K",
                   help="gradient accumulation: each global batch in K micro-steps per device, gradients synchronised "
                        "on the last (under ddp: no_sync before it)")
    t.add_argument("--shard", metavar=choices_metavar(SHARD_MODES), default=d.shard,
                   help="fsdp: fully_shard each block (residual block, layer) then the root, or the whole model as one")
    t.add_argument("--reshard-after-forward", metavar=choices_metavar(RESHARD_MODES), default=d.reshard_after_forward,
                   help="fsdp: free the gathered weights after forward and gather them again for backward (less "
                        "memory), or keep them (less communication)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir (starts afresh, saying so, if there is none)")


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
    cfg = config_or_exit(parser, **{k: v for k, v in vars(args).items() if k not in ("command", "command_mains")})
    from mgpu.run import train  # after checking: `--help`, typos and bad values answer without importing torch

    def run() -> int:
        train(cfg)
        return EXIT_OK

    return end_command(run, failures=(LaunchError, NonFiniteLossError))
