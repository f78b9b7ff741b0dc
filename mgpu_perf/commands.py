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

from mgpu.errors import EXIT_FAILED, EXIT_OK, ConfigError, OneLineParser, one_line
from mgpu.devices import torch_threads
from mgpu.options import Options, comma_list, option
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


# -- the options of ddp-scaling and hot-path, each declared once ----------------------------------------
# Text no number is argparse's own message ('argument --width: invalid int value: 'x''); the training
# settings (width, batch, ranks) are checked by mgpu's TrainConfig.validate, with its messages.

def _integer(text: str, flag: str, error: type[Exception]) -> int:
    try:
        return int(text)
    except ValueError:
        raise error(f"argument {flag}: invalid int value: {text!r}") from None


def _decimal(text: str, flag: str, error: type[Exception]) -> float:
    try:
        return float(text)
    except ValueError:
        raise error(f"argument {flag}: invalid float value: {text!r}") from None


def _at_least(lowest: int) -> Callable:
    """A check: None (not given) or a count >= lowest, '--rounds must be at least 1, got 0'."""
    def check(value, flag: str, error: type[Exception]):
        if value is not None and value < lowest:
            raise error(f"{flag} must be at least {lowest}, got {value}")
        return value
    return check


def _positive_number(value, flag: str, error: type[Exception]):
    if value is not None and not (math.isfinite(value) and value > 0):
        raise error(f"{flag} must be a positive number, got {value}")
    return value


def _rank_counts(value: tuple, flag: str, error: type[Exception]) -> tuple:
    """A check: at least one rank count; the counts in order, each once (their sizes: validate)."""
    if not value:
        raise error(f"{flag} needs at least one rank count")
    return tuple(sorted(set(value)))


@dataclass(frozen=True, kw_only=True)
class MeasureOptions(Options):
    """What ddp-scaling and hot-path share: the network, the batch, the interleaved rounds."""

    error = ConfigError
    width: int = option(64, text=_integer, help="ResNet-18 width (64: the full network)")
    batch: int = option(32, text=_integer, help="per-rank batch")
    rounds: int = option(12, text=_integer, check=_at_least(1),
                         help="timed rounds, interleaved: one step of every case each")
    warmup: int = option(2, text=_integer, check=_at_least(0), help="untimed steps first")

    def trains_on(self, ranks: int, flag: str) -> None:
        """mgpu's TrainConfig accepts this width and batch on `ranks` ranks, or the error names the options."""
        try:
            TrainBench("ddp", ranks, per_device_batch=self.batch, width=self.width).train_config()
        except ConfigError as e:
            raise self.error(f"{e} ({flag} {ranks}, --batch {self.batch}, --width {self.width})") from None


@dataclass(frozen=True, kw_only=True)
class DdpScalingOptions(MeasureOptions):
    devices: tuple[int, ...] = option((1, 2), help="rank counts, e.g. 1,2 (default)", check=_rank_counts,
                                      text=comma_list(int, empty_ok=True,
                                                      message="argument {flag}: expected rank counts like 1,2, "
                                                              "got {text!r}"))
    threads: int | None = option(None, text=_integer, check=_at_least(1),
                                 help="threads per rank (default: cores // most ranks)")
    min_speedup: float | None = option(None, text=_decimal, check=_positive_number,
                                       help="exit 1 unless the largest count's speedup over the first reaches this")

    def validate(self) -> "DdpScalingOptions":
        for n in self.devices:
            self.trains_on(n, "--devices")
        return self


@dataclass(frozen=True, kw_only=True)
class HotPathOptions(MeasureOptions):
    ranks: int = option(2, text=_integer, help="DDP ranks")

    def validate(self) -> "HotPathOptions":
        self.trains_on(self.ranks, "--ranks")
        return self


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
    DdpScalingOptions.add_to(p.add_argument, only=("devices",))  # --devices first, as it always came
    DdpScalingOptions.add_to(p.add_argument, leave_out=("devices",))
    h = sub.add_parser("hot-path", help="mgpu's step against bare PyTorch; DDP against no communication")
    HotPathOptions.add_to(h.add_argument)
    for name, command in OWN_PARSERS.items():  # listed here; their own parsers read their lines
        sub.add_parser(name, add_help=False, help=command.help)
    return parser


def _hot_path_main(o: HotPathOptions) -> int:
    try:
        measure_hot_path(o.width, o.batch, o.rounds, o.warmup, o.ranks)
    except RankPoolError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _ddp_scaling_main(o: DdpScalingOptions) -> int:
    try:
        rows = measure_ddp_scaling(o.devices, width=o.width, per_rank_batch=o.batch, rounds=o.rounds,
                                   warmup=o.warmup, threads_per_rank=o.threads)
    except RankPoolError as e:  # a rank failed while running: its error, not a traceback
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if o.min_speedup is not None and rows[-1]["speedup"] < o.min_speedup:
        print(f"FAIL: speedup {rows[-1]['speedup']:.2f} at {rows[-1]['ranks']} ranks is below {o.min_speedup}",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


# The commands build_parser reads: each one's options (converted and checked: its error names the bad
# option), then its main.
MEASURES = {"ddp-scaling": (DdpScalingOptions, _ddp_scaling_main), "hot-path": (HotPathOptions, _hot_path_main)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in OWN_PARSERS:
        return OWN_PARSERS[argv[0]].run(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    options_class, run = MEASURES[args.command]
    try:
        options = options_class.from_namespace(args)
    except options_class.error as e:
        parser.error(one_line(e))
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
