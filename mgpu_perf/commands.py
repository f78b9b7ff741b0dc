"""`python -m mgpu_perf ddp-scaling` and `python -m mgpu_perf hot-path`: throughput figures, interleaved, as commands.

    python -m mgpu_perf ddp-scaling                # full-width ResNet-18, 1 vs 2 ranks, one thread each
    python -m mgpu_perf ddp-scaling --devices 1,2,4 --batch 32 --rounds 10 --min-speedup 1.8
    python -m mgpu_perf hot-path                   # mgpu's step against bare PyTorch, DDP and FSDP against no communication
    python -m mgpu_perf validate-gate              # the A/B gate's measured error rates (lab/validate_gate.py)
    python -m mgpu_perf validate-counts            # its counted verdict against planted regressions (lab/validate_counts.py)
    python -m mgpu_perf calibrate [--model M:F]    # the gate's noise and smallest detectable change (lab/calibrate.py)
    python -m mgpu_perf bench | gate | history ... # `python -m mgpu bench | gate | history`, from a checkout not installed

Exit codes: 0 done, 1 a rank failed or the speedup is below --min-speedup, 2 bad input (one line).
The ranks of every count start first (one pool per count; idle pools wait on their queues and
take no CPU), then their steps are interleaved (`mgpu_perf.harness.interleave.interleaved_step_times`).
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable

from mgpu.errors import EXIT_FAILED, EXIT_OK, OneLineParser, one_line
from mgpu.devices import torch_threads
from mgpu_perf.harness.interleave import interleaved_ratio, interleaved_ratios, interleaved_step_times, scaling_rows
from mgpu_perf.harness.ranks import IndependentPool, RankPoolError, StrategyRankPool
from mgpu_perf.harness.sessions import BareStep, TrainBench, TrainSession, cpu_cores

PROG = "python -m mgpu_perf"


def measure_ddp_scaling(counts=(1, 2), width: int = 64, per_rank_batch: int = 32, rounds: int = 12, warmup: int = 2,
                        threads_per_rank: int | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """DDP step throughput at each rank count, weak scaling, every rank with the same threads:
    the rows of `scaling_rows`, with the threads per rank added."""
    threads_per_rank = threads_per_rank or max(1, cpu_cores() // max(counts))
    benches = {n: TrainBench("ddp", n, per_device_batch=per_rank_batch, width=width, threads_per_device=threads_per_rank)
               for n in counts}
    with ExitStack() as stack:
        pools = {n: stack.enter_context(StrategyRankPool(bench)) for n, bench in benches.items()}
        rows = scaling_rows(interleaved_step_times(pools, rounds, warmup), per_rank_batch)
        for row in rows:
            row["threads_per_rank"] = pools[row["ranks"]].threads_per_rank
    for row in rows:
        log(f"{row['ranks']} rank(s) x {row['threads_per_rank']} thread(s): step {row['step_s_median']:.3f} s "
            f"(fastest {row['step_s_min']:.3f}), {row['images_per_s']:.1f} img/s, speedup {row['speedup']:.2f}, "
            f"efficiency {row['efficiency']:.2f}")
    return rows


def measure_hot_path(width: int = 64, batch: int = 32, rounds: int = 12, warmup: int = 2, ranks: int = 2,
                     log: Callable[[str], None] = print) -> dict:
    """The hot path's two CPU figures, each interleaved round by round:
    - `single`: mgpu's single-device step (Trainer.step) against a bare PyTorch loop on the same
      model, batches and SGD, both in this process, one thread: throughput of mgpu / bare;
    - `ddp` and `fsdp`: DDP (FSDP) with `ranks` ranks against as many independent processes doing
      the same per-rank steps with no communication at all (the physical limit here): throughput of
      DDP / independent and FSDP / independent, the three taken in turn every round."""
    threads = max(1, cpu_cores() // ranks)
    bench = TrainBench("single", 1, per_device_batch=batch, width=width, threads_per_device=threads, steps_per_epoch=4)
    with torch_threads(threads):  # the sessions set it too; the caller's count comes back after
        mgpu_step, bare = TrainSession(bench), BareStep(bench)
        single = interleaved_ratio(mgpu_step.step, bare.step, rounds, warmup)
        mgpu_step.close()
    benches = {s: TrainBench(s, ranks, per_device_batch=batch, width=width, threads_per_device=threads, steps_per_epoch=4)
               for s in ("ddp", "fsdp")}
    with StrategyRankPool(benches["ddp"]) as ddp, StrategyRankPool(benches["fsdp"]) as fsdp:
        independent = IndependentPool(benches["ddp"])
        try:
            vs = interleaved_ratios({"ddp": ddp.step, "fsdp": fsdp.step, "independent": independent.step},
                                    "independent", rounds, warmup)
        finally:
            independent.close()
    ddp_vs, fsdp_vs = vs["ddp"], vs["fsdp"]
    log(f"single: mgpu's step at {single['ratio_median']:.3f} of a bare PyTorch loop's throughput (median of "
        f"{rounds} interleaved rounds, range {single['ratio_min']:.3f}-{single['ratio_max']:.3f}; "
        f"{single['a_median_s'] * 1e3:.0f} ms vs {single['b_median_s'] * 1e3:.0f} ms a step)")
    log(f"ddp: {ranks} DDP ranks at {ddp_vs['ratio_median']:.3f} of {ranks} processes with no communication "
        f"(range {ddp_vs['ratio_min']:.3f}-{ddp_vs['ratio_max']:.3f}; {ddp_vs['a_median_s'] * 1e3:.0f} ms vs "
        f"{ddp_vs['b_median_s'] * 1e3:.0f} ms a step; width {width}, {batch} images a rank, {threads} thread(s) each)")
    log(f"fsdp: {ranks} FSDP ranks at {fsdp_vs['ratio_median']:.3f} of {ranks} processes with no communication "
        f"(range {fsdp_vs['ratio_min']:.3f}-{fsdp_vs['ratio_max']:.3f}; {fsdp_vs['a_median_s'] * 1e3:.0f} ms vs "
        f"{fsdp_vs['b_median_s'] * 1e3:.0f} ms a step; sharded per block, resharded after forward)")
    return {"single_vs_bare": single, "ddp_vs_independent": ddp_vs, "fsdp_vs_independent": fsdp_vs, "width": width,
            "batch": batch, "ranks": ranks, "threads": threads}


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


@dataclass(frozen=True)
class OwnParser:
    """A subcommand with a parser of its own: `python -m mgpu_perf NAME ...` hands it the whole line."""
    help: str
    run: Callable[[list[str]], int]  # the line, the command's name first; the exit code


def _mgpu_command(argv: list[str]) -> int:
    """mgpu's commands that this package adds (mgpu_perf/cli.py), installed or not."""
    import os

    from mgpu import cli

    os.environ[cli.COMMANDS_ENV] = ",".join(filter(None, [os.environ.get(cli.COMMANDS_ENV), "mgpu_perf.cli"]))
    return cli.main(argv)


def _main_of(module: str) -> Callable[[list[str]], int]:
    """The `main` of a lab tool, imported only when its command runs, given the line after its name."""
    def run(argv: list[str]) -> int:
        return importlib.import_module(module).main(argv[1:])

    return run


OWN_PARSERS = {
    "bench": OwnParser("`python -m mgpu bench`, here without installing (`bench --help`)", _mgpu_command),
    "gate": OwnParser("`python -m mgpu gate`, here without installing (`gate --help`)", _mgpu_command),
    "history": OwnParser("`python -m mgpu history`, here without installing (`history --help`)", _mgpu_command),
    "validate-gate": OwnParser("the A/B gate's false-alarm and detection rates, measured (`validate-gate --help`)",
                               _main_of("mgpu_perf.lab.validate_gate")),
    "validate-counts": OwnParser("the gate's counted verdict against planted structural regressions, measured "
                                 "(`validate-counts --help`)", _main_of("mgpu_perf.lab.validate_counts")),
    "calibrate": OwnParser("each gated benchmark's noise and the smallest change the A/B gate can call in its "
                           "budget, no baseline (`calibrate --help`)", _main_of("mgpu_perf.lab.calibrate")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    p = sub.add_parser("ddp-scaling", help="DDP step throughput at 1, 2, ... ranks (weak scaling)")
    p.add_argument("--devices", type=_counts, default=(1, 2), help="rank counts, e.g. 1,2 (default)")
    p.add_argument("--width", type=int, default=64, help="ResNet-18 width (64: the full network)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch")
    p.add_argument("--rounds", type=int, default=12, help="timed steps per rank count (interleaved)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: cores // most ranks)")
    p.add_argument("--min-speedup", type=float, default=None,
                   help="exit 1 unless the largest count's speedup over the first reaches this")
    h = sub.add_parser("hot-path", help="mgpu's step against bare PyTorch; DDP against no communication")
    h.add_argument("--width", type=int, default=64, help="ResNet-18 width (64: the full network)")
    h.add_argument("--batch", type=int, default=32, help="per-rank batch")
    h.add_argument("--rounds", type=int, default=12, help="interleaved rounds")
    h.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    h.add_argument("--ranks", type=int, default=2, help="DDP ranks")
    for name, command in OWN_PARSERS.items():  # listed here; their own parsers read their lines
        sub.add_parser(name, add_help=False, help=command.help)
    return parser


def check_hot_path_args(args: argparse.Namespace) -> None:
    from mgpu.errors import ConfigError

    if args.rounds < 1 or args.warmup < 0:
        raise ValueError(f"--rounds must be at least 1 and --warmup at least 0, got {args.rounds}, {args.warmup}")
    try:
        TrainBench("ddp", args.ranks, per_device_batch=args.batch, width=args.width).train_config()
    except ConfigError as e:
        raise ValueError(f"{e} (--ranks {args.ranks}, --batch {args.batch}, --width {args.width})") from None


def _hot_path_main(args: argparse.Namespace) -> int:
    try:
        measure_hot_path(args.width, args.batch, args.rounds, args.warmup, args.ranks)
    except RankPoolError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _ddp_scaling_main(args: argparse.Namespace) -> int:
    try:
        rows = measure_ddp_scaling(args.devices, width=args.width, per_rank_batch=args.batch, rounds=args.rounds,
                                   warmup=args.warmup, threads_per_rank=args.threads)
    except RankPoolError as e:  # a rank failed while running: its error, not a traceback
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.min_speedup is not None and rows[-1]["speedup"] < args.min_speedup:
        print(f"FAIL: speedup {rows[-1]['speedup']:.2f} at {rows[-1]['ranks']} ranks is below {args.min_speedup}",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# The commands build_parser reads: each one's checks (ValueError naming the bad option), then its main.
MEASURES = {"ddp-scaling": (check_args, _ddp_scaling_main), "hot-path": (check_hot_path_args, _hot_path_main)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in OWN_PARSERS:
        return OWN_PARSERS[argv[0]].run(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    check, run = MEASURES[args.command]
    try:
        check(args)
    except ValueError as e:
        parser.error(one_line(e))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
