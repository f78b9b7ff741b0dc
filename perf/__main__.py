"""`python -m perf ddp-scaling`: DDP step throughput at 1, 2, ... ranks, interleaved, as a command.

    python -m perf ddp-scaling                     # full-width ResNet-18, 1 vs 2 ranks, one thread each
    python -m perf ddp-scaling --devices 1,2,4 --batch 32 --rounds 10 --min-speedup 1.8

Exit codes: 0 done, 1 a rank failed or the speedup is below --min-speedup, 2 bad input (one line).
The ranks of every count start first (one pool per count; idle pools wait on their queues and
take no CPU), then their steps are interleaved (`perf.workloads.interleaved_step_times`).
"""

from __future__ import annotations

import argparse
import math
import sys
from contextlib import ExitStack
from typing import Callable

from perf.workloads import DDPRankPool, RankPoolError, TrainBench, cpu_cores, interleaved_step_times, scaling_rows

PROG = "python -m perf"


def measure_ddp_scaling(counts=(1, 2), width: int = 64, per_rank_batch: int = 32, rounds: int = 12, warmup: int = 2,
                        threads_per_rank: int | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """DDP step throughput at each rank count, weak scaling, every rank with the same threads:
    the rows of `scaling_rows`, with the threads per rank added."""
    threads_per_rank = threads_per_rank or max(1, cpu_cores() // max(counts))
    benches = {n: TrainBench("ddp", n, per_device_batch=per_rank_batch, width=width, threads_per_device=threads_per_rank)
               for n in counts}
    with ExitStack() as stack:
        pools = {n: stack.enter_context(DDPRankPool(bench)) for n, bench in benches.items()}
        rows = scaling_rows(interleaved_step_times(pools, rounds, warmup), per_rank_batch)
        for row in rows:
            row["threads_per_rank"] = pools[row["ranks"]].threads_per_rank
    for row in rows:
        log(f"{row['ranks']} rank(s) x {row['threads_per_rank']} thread(s): step {row['step_s_median']:.3f} s "
            f"(fastest {row['step_s_min']:.3f}), {row['images_per_s']:.1f} img/s, speedup {row['speedup']:.2f}, "
            f"efficiency {row['efficiency']:.2f}")
    return rows


def _counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(c) for c in text.split(",") if c.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank counts like 1,2, got {text!r}") from None


def check_args(args: argparse.Namespace) -> None:
    """The command's own rules; the training settings (width, batch, ranks) are checked by mgpu's
    TrainConfig.validate, with its messages. Raises ValueError naming the bad option."""
    from mgpu.errors import ConfigError

    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be at least 0, got {args.warmup}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    if args.min_speedup is not None and not (math.isfinite(args.min_speedup) and args.min_speedup > 0):
        raise ValueError(f"--min-speedup must be a positive number, got {args.min_speedup}")
    if not args.devices:
        raise ValueError("--devices needs at least one rank count")
    for n in args.devices:
        try:
            TrainBench("ddp", n, per_device_batch=args.batch, width=args.width).train_config()
        except ConfigError as e:
            raise ValueError(f"{e} (--devices {n}, --batch {args.batch}, --width {args.width})") from None


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage dump) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    p = sub.add_parser("ddp-scaling", help="DDP step throughput at 1, 2, ... ranks (weak scaling)")
    p.add_argument("--devices", type=_counts, default=(1, 2), help="rank counts, e.g. 1,2 (default)")
    p.add_argument("--width", type=int, default=64, help="ResNet-18 width (64: the full network)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch")
    p.add_argument("--rounds", type=int, default=12, help="timed steps per rank count (interleaved)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: cores // most ranks)")
    p.add_argument("--min-speedup", type=float, default=None,
                   help="exit 1 unless the largest count's speedup over the first reaches this")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        rows = measure_ddp_scaling(args.devices, width=args.width, per_rank_batch=args.batch, rounds=args.rounds,
                                   warmup=args.warmup, threads_per_rank=args.threads)
    except RankPoolError as e:  # a rank failed while running: its error, not a traceback
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    if args.min_speedup is not None and rows[-1]["speedup"] < args.min_speedup:
        print(f"FAIL: speedup {rows[-1]['speedup']:.2f} at {rows[-1]['ranks']} ranks is below {args.min_speedup}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
