"""Rank pools: processes started once with torchrun's environment, each holding a server object
(a DDP or FSDP training session, a collective peer) and running the commands the parent names.

    with StrategyRankPool(TrainBench("ddp", 2)) as pool:
        pool.step()                             # every rank steps; returns when the slowest is done
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from dataclasses import asdict
from typing import Any, Callable

import torch

from mgpu_perf.harness.sessions import BareStep, TrainBench

__all__ = ["RankPool", "RankPoolError", "StrategyRankPool", "IndependentPool", "spawns_ranks", "rank_context"]


# -- one pool of rank processes, for DDP steps and for collective peers -------------------------

# What the fork server imports once, before it forks any rank (see rank_context). torch._dynamo:
# DDP's constructor imports it (about 1 s of every rank's start otherwise). mgpu_perf.counts.step and
# torch's FLOP counter: the step counted in every rank (the gate's, the counted baseline's). mgpu's
# modules come from the tree of the process that starts the server (a baseline arm: the baseline's);
# a module that tree lacks is skipped by multiprocessing, and the rank that needs it fails as it
# would anyway.
SERVER_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "torch.distributed.fsdp",
                  "mgpu.strategies", "mgpu.trainer", "mgpu_perf.harness.sessions", "mgpu_perf.counts.step",
                  "torch.utils.flop_counter"]


def rank_context():
    """Where rank processes come from: multiprocessing's fork server, which has imported torch and
    this harness once, so that a rank starts without importing them again (a pool of 2 DDP ranks:
    about 1 s instead of 3 s on a 2-core VM, docs/notes/perf.md). Not plain fork: that would copy this
    process's CUDA and thread-pool state into the ranks; the server is a fresh process that never
    touches either. Spawn where there is no fork server."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(SERVER_PRELOAD)  # only the first start of the server reads it
    return ctx


class RankPoolError(RuntimeError):
    """A rank of a pool failed, exited, or did not answer in time (the message names it)."""


def _rank_main(factory: Callable[[], Any], rank: int, world_size: int, env: dict, inbox, outbox,
               idle_timeout_s: float) -> None:
    """Inside each rank: the parent's environment as it is now (the fork server's is as it was when
    it started) with torchrun's variables, the server object, then the parent's commands."""
    os.environ.clear()
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    try:
        server = factory()
        outbox.put((rank, "ready", getattr(server, "ready_info", lambda: None)(), None))
        while True:
            try:
                command, args = inbox.get(timeout=idle_timeout_s)
            except queue.Empty:
                return  # the parent went away
            if command == "stop":
                break
            outbox.put((rank, command, getattr(server, command)(*args), None))
        getattr(server, "close", lambda: None)()
    except BaseException as e:  # reported to the parent, which raises it as a RankPoolError
        outbox.put((rank, "error", None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class RankPool:
    """Processes `first_rank .. world_size - 1`, started once with torchrun's environment (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...); each builds `factory()` and runs the methods the
    parent names. `run(command, *args)` returns every rank's answer, in rank order.

    `first_rank=1` leaves rank 0 to this process (collective peers: the caller joins the group).
    """

    def __init__(self, factory: Callable[[], Any], world_size: int, first_rank: int = 0, port: int | None = None,
                 command_timeout_s: float = 300.0, idle_timeout_s: float = 900.0):
        ctx = rank_context()
        self.world_size, self.command_timeout_s = world_size, command_timeout_s
        from mgpu.launch import free_port

        self.port = port or free_port()
        self.ranks = list(range(first_rank, world_size))
        env = dict(os.environ, WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(self.port), TORCHELASTIC_USE_AGENT_STORE="False")  # rank 0 hosts the store
        self._outbox = ctx.Queue()
        self._inboxes = {r: ctx.Queue() for r in self.ranks}
        self._procs = {r: ctx.Process(target=_rank_main, daemon=True, name=f"perf-rank-{r}",
                                      args=(factory, r, world_size, env, self._inboxes[r], self._outbox,
                                            idle_timeout_s)) for r in self.ranks}
        for p in self._procs.values():
            p.start()
        self.ready = None

    def wait_ready(self) -> list:
        self.ready = self._gather("ready")
        return self.ready

    def _gather(self, command: str) -> list:
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + self.command_timeout_s
        while len(answers) < len(self.ranks):
            try:
                rank, what, value, error = self._outbox.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in self._procs.items() if not p.is_alive() and r not in answers]
                if dead:
                    code = self._procs[dead[0]].exitcode
                    self.kill()
                    raise RankPoolError(f"rank {dead[0]} exited (code {code}) before answering {command!r}") from None
                if time.monotonic() > deadline:
                    self.kill()
                    raise RankPoolError(f"ranks did not answer {command!r} within {self.command_timeout_s:g} s")
                continue
            if error is not None:
                self.kill()
                raise RankPoolError(f"rank {rank} failed: {error.strip()}")
            if what != command:
                self.kill()
                raise RankPoolError(f"rank {rank} answered {what!r} to {command!r}")
            answers[rank] = value
        return [answers[r] for r in self.ranks]

    def send(self, command: str, *args) -> None:
        for inbox in self._inboxes.values():
            inbox.put((command, args))

    def collect(self, command: str) -> list:
        return self._gather(command)

    def run(self, command: str, *args) -> list:
        self.send(command, *args)
        return self._gather(command)

    def kill(self) -> None:
        for p in self._procs.values():
            if p.is_alive():
                p.kill()
        for p in self._procs.values():
            p.join(timeout=5)

    def close(self) -> None:
        for r, inbox in self._inboxes.items():
            if self._procs[r].is_alive():
                inbox.put(("stop", ()))
        for p in self._procs.values():
            p.join(timeout=30)
        self.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spawns_ranks(strategy: str) -> bool:
    """One process per device (ddp, fsdp): timed through a StrategyRankPool. Asked of the mgpu this
    process imports, which in a baseline arm may be older (and know fewer strategies)."""
    from mgpu.strategies import get_strategy

    return get_strategy(strategy).spawns_ranks



class _RankServer:
    """What each rank of a StrategyRankPool holds: mgpu's ddp (or fsdp) strategy in a training
    session (`bench.open`: a TrainSession of mgpu's ResNet, or a ModelSession of a user's model)."""

    def __init__(self, bench):
        from mgpu_perf.counts.step import CompileWatch

        self.compile_watch = CompileWatch() if bench.compile else None  # graphs and breaks from the start
        strategy = bench.create_strategy()
        if strategy.devices[0].type == "cpu" and bench.threads_per_device:
            # create() gives each rank cores // ranks threads; a benchmark wants the same share at every count.
            torch.set_num_threads(bench.threads_per_device)
        self.session = bench.open(strategy)

    def ready_info(self) -> int:
        return torch.get_num_threads()

    def step(self) -> float:
        return self.session.step()

    def epoch(self):
        return asdict(self.session.epoch())

    def count_step(self, collect_garbage: bool = True) -> dict:
        from mgpu_perf.counts.step import count_step

        return count_step(self.session.step, self.compile_watch, collect_garbage).to_dict()

    def weights_moved(self) -> float:
        return self.session.weights_moved()

    def memory_bytes(self) -> dict:
        return self.session.memory_bytes()

    def close(self) -> None:
        self.session.close()


class _Factory:
    """A picklable `cls(*args)` for the ranks to call."""

    def __init__(self, cls, *args):
        self.cls, self.args = cls, args

    def __call__(self):
        return self.cls(*self.args)


class StrategyRankPool:
    """`bench.devices` ranks of the ddp or fsdp strategy, started once; `step()` / `epoch()` run in
    all of them and return when every rank has finished (rank 0's answer).

        with StrategyRankPool(TrainBench("ddp", 2, threads_per_device=1)) as pool:
            pool.step()          # time this: the slowest rank's step, gradient allreduce included
    """

    def __init__(self, bench, command_timeout_s: float = 300.0):
        if not spawns_ranks(bench.strategy):
            raise ValueError(f"StrategyRankPool runs a strategy with one process per device, not {bench.strategy!r}")
        bench.train_config()  # bad settings fail here, once, rather than in every rank
        self.bench = bench
        self.pool = RankPool(_Factory(_RankServer, bench), bench.devices, command_timeout_s=command_timeout_s)
        self.threads_per_rank = self.pool.wait_ready()[0]

    def step(self) -> float:
        return self.pool.run("step")[0]

    def epoch(self):
        from mgpu.results import EpochStats

        return EpochStats(**self.pool.run("epoch")[0])

    def count_step(self, collect_garbage: bool = True) -> list[dict]:
        """One step counted in every rank (mgpu_perf/counts/step.py): each rank's counts, in rank order."""
        return self.pool.run("count_step", collect_garbage)

    def weights_moved(self) -> float:
        return self.pool.run("weights_moved")[0]

    def memory_bytes(self) -> dict:
        return self.pool.run("memory_bytes")[0]  # rank 0's

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "StrategyRankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _IndependentRank:
    def __init__(self, bench: TrainBench):
        self.bare = BareStep(bench, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))

    def ready_info(self) -> int:
        return self.bare.ready_info()

    def step(self) -> float:
        return self.bare.step()


class IndependentPool:
    """`bench.devices` processes doing DDP's (and FSDP's) per-rank steps with no communication at
    all: the physical limit of either on this machine. `step()` returns when the slowest is done."""

    def __init__(self, bench: TrainBench):
        self.pool = RankPool(_Factory(_IndependentRank, bench), bench.devices)
        self.threads_per_rank = self.pool.wait_ready()[0]

    def step(self) -> float:
        return self.pool.run("step")[0]

    def close(self) -> None:
        self.pool.close()


