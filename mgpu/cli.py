"""`python -m mgpu train ...`: the chapter's experiment from the command line.

    python -m mgpu train --model lenet --epochs 2 --train-size 8192 --test-size 2000
    python -m mgpu train --strategy ddp --devices 2 --batch-size 512 --lr 0.2

Every mistake a user can make ends in one line on stderr, `mgpu: error: ...`, and exit code 2.
Exit codes (docs/failures.md lists every case):

    0    the run finished
    1    the run failed while training: a rank failed (its error is shown), or a NaN/Inf loss
    2    bad input: a wrong option, missing or corrupt data, an unwritable folder, a bad checkpoint
    130  interrupted by Ctrl-C (SIGINT); 143 stopped by SIGTERM; every rank is stopped first
"""

from __future__ import annotations

import argparse
import math
import sys

from mgpu.config import DATA_NAMES, MODEL_NAMES, NONFINITE_POLICIES, STRATEGY_NAMES, TrainConfig
from mgpu.errors import LaunchError, MgpuError, NonFiniteLossError

EXIT_FAILED = 1
EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and exit code 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"mgpu: error: {message}\n")


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    return parse


def _int_between(low: int, high: int):
    at_least = _int_at_least(low)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}, got {value}")
        return value
    return parse


def _float_range(low: float, inclusive: bool, high: float | None = None):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive) or (high is not None and value >= high):
            bound = f"{'>=' if inclusive else '>'} {low:g}" + (f" and < {high:g}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="mgpu", allow_abbrev=False, description="Data-parallel training, checked against one device.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    t = commands.add_parser("train", allow_abbrev=False, help="train a model and print the chapter's line",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = TrainConfig()
    t.add_argument("--strategy", choices=STRATEGY_NAMES, default=d.strategy, help="how to spread the work")
    t.add_argument("--devices", type=_int_at_least(1), default=d.devices,
                   help="devices (replicas, or ranks for ddp); emulated on the CPU when GPUs are short")
    t.add_argument("--require-gpus", action="store_true", help="fail instead of emulating missing GPUs")
    t.add_argument("--epochs", type=_int_at_least(1), default=d.epochs)
    t.add_argument("--batch-size", type=_int_at_least(1), default=d.batch_size, help="global batch size")
    t.add_argument("--lr", type=_float_range(0.0, inclusive=False), default=d.lr, help="learning rate")
    t.add_argument("--momentum", type=_float_range(0.0, inclusive=True, high=1.0), default=d.momentum)
    t.add_argument("--weight-decay", type=_float_range(0.0, inclusive=True), default=d.weight_decay)
    t.add_argument("--model", choices=MODEL_NAMES, default=d.model)
    t.add_argument("--width", type=_int_at_least(1), default=d.width, help="ResNet-18 base width")
    t.add_argument("--data", choices=DATA_NAMES, default=d.data)
    t.add_argument("--data-dir", default=d.data_dir, help="folder with FashionMNIST/raw/ (torchvision layout)")
    t.add_argument("--download", action="store_true", help="download Fashion-MNIST if it is missing")
    t.add_argument("--resize", type=_int_at_least(1), default=None, help="resize images to this side")
    t.add_argument("--train-size", type=_int_at_least(1), default=None, help="use the first N training examples")
    t.add_argument("--test-size", type=_int_at_least(1), default=None, help="use the first N test examples")
    t.add_argument("--seed", type=_int_at_least(0), default=d.seed)
    t.add_argument("--out", default=d.out, help="folder for results.json, accuracy.png and model.pt")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    t.add_argument("--on-nonfinite", choices=NONFINITE_POLICIES, default=d.on_nonfinite,
                   help="on a NaN/Inf loss: stop with an error, or skip that step's update")
    t.add_argument("--port", type=_int_between(1, 65535), default=None,
                   help="ddp rendezvous port (default: a free one, chosen per run)")
    t.add_argument("--timeout", type=_float_range(0.0, inclusive=False), default=d.timeout,
                   help="ddp: seconds a rank waits for the others")
    t.add_argument("--sync-bn", action="store_true", help="ddp: use SyncBatchNorm (CUDA only)")
    t.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="save model, optimizer, RNG states and epoch to DIR/checkpoint.pt after every epoch")
    t.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir (starts afresh, saying so, if there is none)")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    fields = {k: v for k, v in vars(args).items() if k != "command"}
    return TrainConfig(**fields)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mgpu.train import train  # after parsing: `--help` and typos answer without importing torch's world

    try:
        train(config_from_args(args))
    except LaunchError as e:
        # A rank failed: its error first, then what the others did (and a traceback, if it was a bug).
        print(f"mgpu: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except NonFiniteLossError as e:
        print(f"mgpu: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_FAILED
    except MgpuError as e:
        print(f"mgpu: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM to the launcher (mgpu.launch.Terminated)
        signum = getattr(e, "signum", 2)
        print(f"mgpu: {'interrupted' if signum == 2 else 'terminated'}: every rank stopped", file=sys.stderr)
        return 128 + signum
    return 0


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n"))
