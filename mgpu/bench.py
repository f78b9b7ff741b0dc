"""Timing helpers for the perf suite (perf/), and the DDP scaling check as a command.

    python -m mgpu.bench ddp-scaling                     # full-width ResNet-18, 1 vs 2 ranks, one thread each
    python -m mgpu.bench ddp-scaling --devices 1,2,4 --batch 32 --rounds 10 --min-speedup 1.8

What is here:
- `TrainBench`: one training benchmark's settings (strategy, device count, per-device batch, width).
- `TrainSession`: a strategy set up on synthetic data that runs one step or one epoch on demand.
- `DDPRankPool`: DDP ranks started once (process start costs seconds) that run a step or an epoch
  each time the parent asks, so the parent times every step itself and a benchmark's statistics
  are the DDP step times, collectives and the slowest rank included.
- `interleaved_step_times` / `measure_ddp_scaling`: DDP at several rank counts with their steps taken
  in turn, so that a machine whose speed drifts cannot favour one count.
- `CollectivePeers`: this process as rank 0 of a process group whose other ranks mirror each of its
  `all_reduce` calls, so `torch.distributed.all_reduce` is timed in the caller.

Scaling here is weak scaling: the per-device batch is fixed, the global batch grows with the device
count. On a CPU every emulated device (replica or rank) gets the same share of the cores at every
device count (`threads_per_device`), so a speedup measures parallel execution, not extra threads.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import queue
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from mgpu import devices as devmod
from mgpu.config import TrainConfig
from mgpu.errors import ConfigError, LaunchError, MgpuError
from mgpu.launch import free_port, spawn
from mgpu.models import build_model
from mgpu.strategies import DistributedDataParallel, Strategy, get_strategy
from mgpu.train import EpochStats, Trainer, make_loaders, make_optimizer_factory

__all__ = ["cpu_cores", "TrainBench", "TrainSession", "DDPRankPool", "CollectivePeers", "allreduce_pattern",
           "interleaved_step_times", "scaling_rows", "measure_ddp_scaling", "main"]


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    return len(devmod.usable_cores())


# -- training ----------------------------------------------------------------------------------

@dataclass
class TrainBench:
    """Settings of one training benchmark. Weak scaling: the per-device batch is fixed."""

    strategy: str                    # single | manual | dataparallel | ddp
    devices: int                     # devices (replicas, or DDP ranks)
    per_device_batch: int = 32
    width: int = 64                  # ResNet-18 base width; 64 is the full network
    steps_per_epoch: int = 3         # the "short epoch"
    threads_per_device: int | None = None  # CPU: torch threads per replica/rank (None: torch's default)
    seed: int = 0
    lr: float = 0.05

    @property
    def global_batch(self) -> int:
        return self.per_device_batch * self.devices

    def train_config(self) -> TrainConfig:
        return TrainConfig(strategy=self.strategy, devices=self.devices, batch_size=self.global_batch, lr=self.lr,
                           model="resnet18", width=self.width, train_size=self.global_batch * self.steps_per_epoch,
                           test_size=self.global_batch, seed=self.seed, epochs=1, out=None,
                           progress=False).validate()


class TrainSession:
    """A strategy with its model, optimizer(s) and synthetic data, stepping on demand.

    `step` runs one global batch through the same code `python -m mgpu train` runs (the Trainer's
    `_run_batch`), then waits for every device, so a timer around it measures the whole step.
    """

    def __init__(self, bench: TrainBench, strategy: Strategy | None = None):
        cfg = bench.train_config()
        devmod.keep_freed_memory()  # as `python -m mgpu train` does
        self.bench = bench
        self.strategy = strategy or get_strategy(cfg.strategy).create(cfg)
        train_loader, test_loader = make_loaders(cfg)
        model = build_model(cfg.model, width=cfg.width, seed=cfg.seed)
        self.initial = [p.detach().clone() for p in model.parameters()]  # CPU copies, before any update
        self.strategy.setup(model, make_optimizer_factory(cfg))
        self.trainer = Trainer(self.strategy, train_loader, test_loader, epochs=1, progress=False, log=lambda _: None)
        self.batches = list(train_loader.index_batches())
        self.steps = self.epochs = 0

    def step(self) -> float:
        """One training step on the next global batch; returns its mean loss."""
        indices = self.batches[self.steps % len(self.batches)]
        loss_sum, _, _ = self.trainer._run_batch(indices, 0, self.steps)  # non-finite loss raises
        self.strategy.synchronize()
        self.steps += 1
        return loss_sum / len(indices)

    def epoch(self) -> EpochStats:
        """One epoch (training, then evaluation on the small test set)."""
        stats = self.trainer._run_epoch(self.epochs)
        self.epochs += 1
        return stats

    def weights_moved(self) -> float:
        """Largest absolute change of any parameter of the main replica since setup."""
        params = self.strategy.modules()[0].parameters()
        return max(float((p.detach().cpu() - p0).abs().max()) for p, p0 in zip(params, self.initial))

    def close(self) -> None:
        self.strategy.teardown()


@dataclass
class _RankJob:
    bench: TrainBench
    inboxes: list          # one command queue per rank
    outbox: Any            # (rank, command, answer) back to the parent
    idle_timeout_s: float  # a rank left without commands this long gives up (its parent died)


def _rank_server(job: _RankJob) -> None:
    """Inside each DDP rank: set up once, then run the parent's commands until "stop"."""
    strategy = DistributedDataParallel.create(job.bench.train_config())
    try:
        if strategy.devices[0].type == "cpu" and job.bench.threads_per_device:
            # create() gives each rank cores // ranks threads; a benchmark wants the same share at every count.
            torch.set_num_threads(job.bench.threads_per_device)
        session = TrainSession(job.bench, strategy)
        inbox = job.inboxes[strategy.rank]
        job.outbox.put((strategy.rank, "ready", torch.get_num_threads()))
        while True:
            try:
                command = inbox.get(timeout=job.idle_timeout_s)
            except queue.Empty:
                raise LaunchError(f"no command for {job.idle_timeout_s:g} s: the benchmark went away") from None
            if command == "stop":
                return
            job.outbox.put((strategy.rank, command, getattr(session, command)()))
    finally:
        strategy.teardown()


class DDPRankPool:
    """`bench.devices` DDP ranks, started once; `step()` / `epoch()` run in all of them and
    return when every rank has finished (rank 0's answer).

        with DDPRankPool(TrainBench("ddp", 2, threads_per_device=1)) as pool:
            pool.step()          # time this: the slowest rank's step, gradient allreduce included
    """

    def __init__(self, bench: TrainBench, command_timeout_s: float = 300.0, idle_timeout_s: float = 900.0):
        if bench.strategy != "ddp":
            raise ConfigError(f"DDPRankPool runs the ddp strategy, not {bench.strategy!r}")
        ctx = mp.get_context("spawn")
        self.bench, self.n, self.command_timeout_s = bench, bench.devices, command_timeout_s
        self._inboxes = [ctx.Queue() for _ in range(self.n)]
        self._outbox = ctx.Queue()
        self._error: BaseException | None = None
        job = _RankJob(bench, self._inboxes, self._outbox, idle_timeout_s)
        self._thread = threading.Thread(target=self._launch, args=(job,), daemon=True, name="mgpu-bench-ranks")
        self._thread.start()
        self.threads_per_rank = self._gather("ready")[0]

    def _launch(self, job: _RankJob) -> None:
        try:
            spawn(_rank_server, job, nprocs=self.n)
        except BaseException as e:  # handed to the caller by _gather
            self._error = e

    def _gather(self, command: str) -> list:
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + self.command_timeout_s
        while len(answers) < self.n:
            try:
                rank, what, value = self._outbox.get(timeout=0.2)  # returns as soon as an answer arrives
            except queue.Empty:
                if not self._thread.is_alive():
                    raise self._error or LaunchError(f"the DDP ranks exited before answering {command!r}")
                if time.monotonic() > deadline:
                    raise LaunchError(f"DDP ranks did not answer {command!r} within {self.command_timeout_s:g} s")
                continue
            if what != command:
                raise LaunchError(f"rank {rank} answered {what!r} to {command!r}")
            answers[rank] = value
        return [answers[r] for r in range(self.n)]

    def run(self, command: str):
        for inbox in self._inboxes:
            inbox.put(command)
        return self._gather(command)[0]

    def step(self) -> float:
        return self.run("step")

    def epoch(self) -> EpochStats:
        return self.run("epoch")

    def weights_moved(self) -> float:
        return self.run("weights_moved")

    def close(self) -> None:
        if self._thread.is_alive():
            for inbox in self._inboxes:
                inbox.put("stop")
            self._thread.join(timeout=30)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> "DDPRankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_rounds(rounds: int, warmup: int) -> None:
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"rounds must be an integer >= 1 and warmup >= 0, got rounds={rounds!r}, warmup={warmup!r}")


def interleaved_step_times(pools: dict[int, DDPRankPool], rounds: int, warmup: int = 0) -> dict[int, list[float]]:
    """Step times of each pool (keyed by rank count), taken in turn: one step at every count, then
    the next round. A machine whose speed drifts (a VM whose host is busy for a minute) then slows
    every count alike, rather than whichever count happened to run during the slow minute, so the
    ratios between counts hold even when the absolute times move."""
    _check_rounds(rounds, warmup)
    for pool in pools.values():
        for _ in range(warmup):
            pool.step()
    times: dict[int, list[float]] = {n: [] for n in pools}
    for _ in range(rounds):
        for n, pool in pools.items():
            start = time.perf_counter()
            loss = pool.step()
            times[n].append(time.perf_counter() - start)
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss {loss} at {n} ranks")
    for n, pool in pools.items():
        if pool.weights_moved() <= 0:
            raise AssertionError(f"weights did not change at {n} ranks")
    return times


def scaling_rows(times: dict[int, list[float]], per_rank_batch: int) -> list[dict]:
    """One row per rank count from its step times: median and fastest step, images/s, and speedup
    and efficiency against the smallest count (normally 1 rank)."""
    rows = []
    for n in sorted(times):
        median = statistics.median(times[n])
        rows.append({"ranks": n, "per_rank_batch": per_rank_batch, "global_batch": per_rank_batch * n,
                     "rounds": len(times[n]), "step_s_median": median, "step_s_min": min(times[n]),
                     "images_per_s": per_rank_batch * n / median})
    base = rows[0]
    for row in rows:
        row["speedup"] = row["images_per_s"] / base["images_per_s"]
        row["efficiency"] = row["speedup"] * base["ranks"] / row["ranks"]
        row["speedup (fastest steps)"] = base["step_s_min"] * row["ranks"] / (row["step_s_min"] * base["ranks"])
    return rows


def measure_ddp_scaling(counts=(1, 2), width: int = 64, per_rank_batch: int = 32, rounds: int = 12, warmup: int = 2,
                        threads_per_rank: int | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """DDP step throughput at each rank count, weak scaling, every rank with the same threads.

    The ranks of every count start first (one pool per count; idle pools wait on their queues and
    take no CPU), then their steps are interleaved (`interleaved_step_times`). Returns the rows of
    `scaling_rows`, with the threads per rank added.
    """
    if not counts or any(not isinstance(n, int) or n < 1 for n in counts):
        raise ConfigError(f"rank counts must be positive integers, got {counts!r}")
    _check_rounds(rounds, warmup)
    threads_per_rank = threads_per_rank or max(1, cpu_cores() // max(counts))
    benches = {n: TrainBench("ddp", n, per_device_batch=per_rank_batch, width=width, threads_per_device=threads_per_rank)
               for n in counts}
    for bench in benches.values():
        bench.train_config()  # bad settings fail here, once, rather than in every rank
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


# -- collectives -------------------------------------------------------------------------------

def allreduce_pattern(numel: int, rank: int, device, dtype=torch.float32) -> torch.Tensor:
    """What rank (or device) `rank` contributes to a checked allreduce: small integers, exact in
    float32 when summed, different on every rank and along the tensor."""
    return ((torch.arange(numel, dtype=torch.int64) * (rank + 3)) % 251 + rank + 1).to(device=device, dtype=dtype)


@dataclass
class _PeerJob:
    rank: int
    world_size: int
    port: int
    backend: str
    inbox: Any
    outbox: Any
    stop_at: Any  # shared counter: the call number after which the current message size ends


def _peer_server(job: _PeerJob) -> None:
    """A helper rank: for each message size it is sent, join the parent's all_reduce calls
    (fresh contribution before each, as the parent's untimed setup does) until the call
    numbered `stop_at`, then report how many elements of its last result were wrong."""
    torch.set_num_threads(1)  # gloo does the work on its own threads; leave the cores to the ranks
    device = torch.device(f"cuda:{job.rank}") if job.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(job.backend, init_method=f"tcp://127.0.0.1:{job.port}", rank=job.rank,
                            world_size=job.world_size, timeout=timedelta(seconds=120))
    try:
        while True:
            numel = job.inbox.get(timeout=900)
            if numel is None:
                return
            mine = allreduce_pattern(numel, job.rank, device)
            expected = sum(allreduce_pattern(numel, r, device) for r in range(job.world_size))
            t = torch.empty_like(mine)
            calls = 0
            while True:
                t.copy_(mine)
                dist.all_reduce(t)
                calls += 1
                if job.stop_at.value == calls:
                    break
            job.outbox.put((job.rank, calls, int((t != expected).sum())))
    finally:
        dist.destroy_process_group()


class CollectivePeers:
    """This process as rank 0 of a `world_size` process group; helper processes are the other
    ranks and mirror every `all_reduce` this process makes, so the caller times it directly.

        peers = CollectivePeers(2, "gloo")
        t = peers.begin(numel)             # the helpers start following
        peers.reset(t); dist.all_reduce(t) # as many times as you like (reset: untimed)
        wrong = peers.end(t, calls)        # wrong elements, this rank's last result and theirs
        peers.close()
    """

    def __init__(self, world_size: int, backend: str, timeout_s: float = 120.0):
        if dist.is_initialized():
            raise LaunchError("a process group already exists in this process")
        ctx = mp.get_context("spawn")
        self.world_size, self.backend = world_size, backend
        self.device = torch.device("cuda:0") if backend == "nccl" else torch.device("cpu")
        port = free_port()
        self._stop_at = ctx.RawValue("q", 0)
        self._outbox = ctx.Queue()
        self._inboxes, self._procs = [], []
        for rank in range(1, world_size):
            inbox = ctx.Queue()
            job = _PeerJob(rank, world_size, port, backend, inbox, self._outbox, self._stop_at)
            proc = ctx.Process(target=_peer_server, args=(job,), name=f"mgpu-peer-{rank}", daemon=True)
            proc.start()
            self._inboxes.append(inbox)
            self._procs.append(proc)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._excepthook = sys.excepthook  # init_process_group wraps it ("[rank0]: ..." on every line), for good
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        self._mine = self._expected = None

    def begin(self, numel: int) -> torch.Tensor:
        self._stop_at.value = 0
        for inbox in self._inboxes:
            inbox.put(numel)
        self._mine = allreduce_pattern(numel, 0, self.device)
        self._expected = sum(allreduce_pattern(numel, r, self.device) for r in range(self.world_size))
        return torch.empty_like(self._mine)

    def reset(self, t: torch.Tensor) -> None:
        t.copy_(self._mine)

    def wrong(self, t: torch.Tensor) -> int:
        return int((t != self._expected).sum())

    def end(self, t: torch.Tensor, calls: int) -> int:
        """Make one last checked call (number calls + 1) that ends the helpers' loop; return
        the wrong elements over all ranks' results of that call."""
        self._stop_at.value = calls + 1  # set before the call the helpers are about to finish
        self.reset(t)
        dist.all_reduce(t)
        wrong = self.wrong(t)
        for _ in self._procs:
            rank, their_calls, their_wrong = self._outbox.get(timeout=120)
            if their_calls != calls + 1:
                raise LaunchError(f"rank {rank} made {their_calls} all_reduce calls, rank 0 made {calls + 1}")
            wrong += their_wrong
        return wrong

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.excepthook = self._excepthook


# -- command line ------------------------------------------------------------------------------

def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(c) for c in text.split(",") if c.strip()}))
    except ValueError:
        counts = ()
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"device counts must be positive integers like 1,2, got {text!r}")
    return counts


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgpu.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ddp-scaling", help="DDP step throughput at 1, 2, ... ranks (weak scaling)")
    p.add_argument("--devices", type=_counts, default=(1, 2), help="rank counts, e.g. 1,2 (default)")
    p.add_argument("--width", type=_int_at_least(1), default=64, help="ResNet-18 width (64: the full network)")
    p.add_argument("--batch", type=_int_at_least(1), default=32, help="per-rank batch")
    p.add_argument("--rounds", type=_int_at_least(1), default=12, help="timed steps per rank count (interleaved)")
    p.add_argument("--warmup", type=_int_at_least(0), default=2, help="untimed steps first")
    p.add_argument("--threads", type=_int_at_least(1), default=None,
                   help="threads per rank (default: cores // most ranks)")
    p.add_argument("--min-speedup", type=_positive_float, default=None,
                   help="exit 1 unless the largest count's speedup over the first reaches this")
    args = parser.parse_args(argv)
    try:
        rows = measure_ddp_scaling(args.devices, width=args.width, per_rank_batch=args.batch, rounds=args.rounds,
                                   warmup=args.warmup, threads_per_rank=args.threads)
    except LaunchError as e:  # a rank failed while running: its error, not a traceback
        print(f"python -m mgpu.bench: {e}", file=sys.stderr)
        return 1
    except MgpuError as e:
        print(f"python -m mgpu.bench: error: {e}", file=sys.stderr)
        return 2
    if args.min_speedup is not None and rows[-1]["speedup"] < args.min_speedup:
        print(f"FAIL: speedup {rows[-1]['speedup']:.2f} at {rows[-1]['ranks']} ranks is below {args.min_speedup}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
