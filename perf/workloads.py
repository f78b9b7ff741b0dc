"""The perf suite's workloads: training sessions, DDP rank pools, collective peers, and the
gated workloads the A/B regression gate times in each arm.

    session = TrainSession(TrainBench("manual", 2, width=16))
    session.step()                              # one global batch through mgpu's Trainer
    with StrategyRankPool(TrainBench("ddp", 2)) as pool:
        pool.step()                             # every rank steps; returns when the slowest is done

This module reaches mgpu only through its public API (TrainConfig, get_strategy, build_model,
make_loaders, make_optimizer_factory, Trainer) and imports nothing else of perf/: the A/B gate
(perf/ab.py) loads this very file into worker processes whose `mgpu` comes from another tree
(the baseline), as asv runs today's benchmarks against each commit.

Scaling here is weak scaling: the per-device batch is fixed, the global batch grows with the device
count. On a CPU every emulated device (replica or rank) gets the same share of the cores at every
device count (`threads_per_device`), so a speedup measures parallel execution, not extra threads.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import statistics
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["cpu_cores", "TrainBench", "TrainSession", "RankPool", "RankPoolError", "StrategyRankPool", "CollectivePeers",
           "allreduce_pattern", "interleaved_step_times", "speedups", "scaling_rows", "GATE_KINDS", "make_gated",
           "BareStep", "IndependentPool", "interleaved_ratio"]


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    from mgpu.devices import usable_cores

    return len(usable_cores())


# -- training ----------------------------------------------------------------------------------

@dataclass
class TrainBench:
    """Settings of one training benchmark. Weak scaling: the per-device batch is fixed."""

    strategy: str                    # single | manual | dataparallel | ddp | fsdp
    devices: int                     # devices (replicas, or DDP ranks)
    per_device_batch: int = 32
    width: int = 64                  # ResNet-18 base width; 64 is the full network
    steps_per_epoch: int = 3         # the "short epoch"
    threads_per_device: int | None = None  # CPU: torch threads per replica/rank (None: torch's default)
    seed: int = 0
    lr: float = 0.05
    amp: str = "off"                 # --amp: off | bf16
    channels_last: bool = False      # --channels-last
    shard: str = "block"             # fsdp: --shard block | model
    reshard_after_forward: str = "on"  # fsdp: --reshard-after-forward on | off

    @property
    def global_batch(self) -> int:
        return self.per_device_batch * self.devices

    def train_config(self):
        """The TrainConfig of this benchmark, validated (mgpu's own rules and messages)."""
        from mgpu.config import TrainConfig

        options = {} if (self.amp, self.channels_last) == ("off", False) else \
            dict(amp=self.amp, channels_last=self.channels_last)  # only then: older mgpu lacks the fields
        if (self.shard, self.reshard_after_forward) != ("block", "on"):
            options.update(shard=self.shard, reshard_after_forward=self.reshard_after_forward)
        return TrainConfig(strategy=self.strategy, devices=self.devices, batch_size=self.global_batch, lr=self.lr,
                           model="resnet18", width=self.width, train_size=self.global_batch * self.steps_per_epoch,
                           test_size=self.global_batch, seed=self.seed, epochs=1, out=None,
                           progress=False, **options).validate()


class TrainSession:
    """A strategy with its model, optimizer(s) and synthetic data, stepping on demand.

    `step` runs one global batch through the Trainer's public `step` (the code `python -m mgpu
    train` runs), then waits for every device, so a timer around it measures the whole step.
    """

    def __init__(self, bench: TrainBench, strategy=None):
        from mgpu import devices as devmod
        from mgpu.models import build_model
        from mgpu.strategies import get_strategy
        from mgpu.trainer import Trainer

        make_loaders, make_optimizer_factory = run_builders()
        cfg = bench.train_config()
        devmod.keep_freed_memory()  # as `python -m mgpu train` does
        self.bench = bench
        self.strategy = strategy or get_strategy(cfg.strategy).create(cfg)
        if (bench.amp, bench.channels_last) != ("off", False):
            self.strategy.use_speed_options(bench.amp, bench.channels_last)
        train_loader, test_loader = make_loaders(cfg)
        model = build_model(cfg.model, width=cfg.width, seed=cfg.seed)
        self.initial = [p.detach().clone() for p in model.parameters()]  # CPU copies, before any update
        self.strategy.setup(model, make_optimizer_factory(cfg))
        reset_peak = getattr(self.strategy, "reset_peak_memory", None)  # a baseline arm's mgpu may predate it
        if reset_peak is not None:
            reset_peak()
        self.trainer = Trainer(self.strategy, train_loader, test_loader, epochs=1, progress=False, log=lambda _: None)
        self.batches = list(train_loader.index_batches())
        self.steps = self.epochs = 0

    def step(self) -> float:
        """One training step on the next global batch; returns its mean loss (a non-finite one raises)."""
        indices = self.batches[self.steps % len(self.batches)]
        result = self.trainer.step(indices, 0, self.steps)
        self.strategy.synchronize()
        self.steps += 1
        return result.loss

    def epoch(self):
        """One epoch (training, then evaluation on the small test set); returns its EpochStats."""
        stats = self.trainer.run_epoch(self.epochs)
        self.epochs += 1
        return stats

    def weights_moved(self) -> float:
        """Largest absolute change of any parameter of the main replica since setup."""
        params = self.strategy.modules()[0].parameters()
        # fsdp's parameters are shards (DTensors): gathered whole, in every rank of the pool at once.
        whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in params]
        return max(float((p.detach().cpu() - p0).abs().max()) for p, p0 in zip(whole, self.initial))

    def memory_bytes(self) -> dict:
        """Training-state bytes on one device (a rank's shards under fsdp): Strategy.memory_bytes."""
        return self.strategy.memory_bytes()

    def close(self) -> None:
        self.strategy.teardown()


# -- one pool of rank processes, for DDP steps and for collective peers -------------------------

class RankPoolError(RuntimeError):
    """A rank of a pool failed, exited, or did not answer in time (the message names it)."""


def _rank_main(factory: Callable[[], Any], rank: int, world_size: int, env: dict, inbox, outbox,
               idle_timeout_s: float) -> None:
    """Inside each rank: torchrun's environment, the server object, then the parent's commands."""
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
        ctx = mp.get_context("spawn")  # fork would copy CUDA and thread-pool state into the ranks
        self.world_size, self.command_timeout_s = world_size, command_timeout_s
        from mgpu.launch import free_port

        self.port = port or free_port()
        self.ranks = list(range(first_rank, world_size))
        env = dict(WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
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


def _spawns_ranks(strategy: str) -> bool:
    """One process per device (ddp, fsdp): timed through a StrategyRankPool. Asked of the mgpu this
    process imports, which in a baseline arm may be older (and know fewer strategies)."""
    from mgpu.strategies import get_strategy

    return get_strategy(strategy).spawns_ranks



class _RankServer:
    """What each rank of a StrategyRankPool holds: mgpu's ddp (or fsdp) strategy in a TrainSession."""

    def __init__(self, bench: TrainBench):
        from mgpu.strategies import get_strategy

        strategy = get_strategy(bench.strategy).create(bench.train_config())
        if strategy.devices[0].type == "cpu" and bench.threads_per_device:
            # create() gives each rank cores // ranks threads; a benchmark wants the same share at every count.
            torch.set_num_threads(bench.threads_per_device)
        self.session = TrainSession(bench, strategy)

    def ready_info(self) -> int:
        return torch.get_num_threads()

    def step(self) -> float:
        return self.session.step()

    def epoch(self):
        return asdict(self.session.epoch())

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

    def __init__(self, bench: TrainBench, command_timeout_s: float = 300.0):
        if not _spawns_ranks(bench.strategy):
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


# -- bare PyTorch: the same steps with no mgpu code in the loop ----------------------------------

class BareStep:
    """The `single` strategy's step written as a plain PyTorch loop: the same model, batches (the
    same global batches, as tensors) and SGD, mean loss, one `.item()` a step. With `rank` set it
    takes that rank's contiguous part of each batch, as a DDP rank would, but talks to nobody."""

    def __init__(self, bench: TrainBench, rank: int | None = None, world_size: int = 1):
        from mgpu.models import build_model
        make_loaders, _ = run_builders()

        if bench.threads_per_device:
            torch.set_num_threads(bench.threads_per_device)
        cfg = bench.train_config()
        train_loader, _ = make_loaders(cfg)
        from mgpu.comm import shard_bounds

        self.batches = []
        for indices in train_loader.index_batches():
            if rank is not None:  # the rank's contiguous part, as the ddp strategy takes it
                start, stop = shard_bounds(len(indices), world_size, rank)
                indices = indices[start:stop]
            self.batches.append(train_loader.dataset.take(indices))
        self.model = build_model(cfg.model, width=cfg.width, seed=cfg.seed)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)
        self.steps = 0

    def ready_info(self) -> int:
        return torch.get_num_threads()

    def step(self) -> float:
        X, y = self.batches[self.steps % len(self.batches)]
        loss = torch.nn.functional.cross_entropy(self.model(X), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        return loss.item()


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


def interleaved_ratios(fns: dict[str, Callable[[], float]], reference: str, rounds: int, warmup: int = 2) -> dict:
    """Time every fn in turn each round (the order reversed every other round: a b c, c b a, ...)
    for `rounds` rounds after warm-up; for each fn but `reference`, its throughput relative to the
    reference's per round (time_reference / time_fn), the median and spread, and both median times."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            loss = fns[name]()
            times[name].append(time.perf_counter() - start)
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss {loss} of {name} in round {i}")
    out = {}
    for name in names:
        if name == reference:
            continue
        ratios = [tr / ta for ta, tr in zip(times[name], times[reference])]
        out[name] = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "a_median_s": statistics.median(times[name]), "b_median_s": statistics.median(times[reference]),
                     "rounds": rounds,
                     "ratio_of_medians": statistics.median(times[reference]) / statistics.median(times[name])}
    return out


def interleaved_ratio(a: Callable[[], float], b: Callable[[], float], rounds: int, warmup: int = 2) -> dict:
    """Time a() and b() in turn (a b, b a, ...) for `rounds` rounds after warm-up; the throughput of
    a relative to b per round (time_b / time_a), its median and spread, and each side's median time."""
    return interleaved_ratios({"a": a, "b": b}, "b", rounds, warmup)["a"]


# -- collectives -------------------------------------------------------------------------------

def allreduce_pattern(numel: int, rank: int, device, dtype=torch.float32) -> torch.Tensor:
    """What rank (or device) `rank` contributes to a checked allreduce: small integers, exact in
    float32 when summed, different on every rank and along the tensor."""
    return ((torch.arange(numel, dtype=torch.int64) * (rank + 3)) % 251 + rank + 1).to(device=device, dtype=dtype)


class _Peer:
    """A helper rank: joins the caller's process group and mirrors its all_reduce calls."""

    def __init__(self, backend: str, stop_at):
        torch.set_num_threads(1)  # gloo does the work on its own threads; leave the cores to the ranks
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=120))
        self.rank, self.world, self.stop_at = rank, world, stop_at

    def follow(self, numel: int) -> tuple[int, int]:
        """Join all_reduce calls (fresh contribution before each) until the call numbered `stop_at`;
        return (calls, wrong elements of the last result)."""
        mine = allreduce_pattern(numel, self.rank, self.device)
        expected = sum(allreduce_pattern(numel, r, self.device) for r in range(self.world))
        t = torch.empty_like(mine)
        calls = 0
        while True:
            t.copy_(mine)
            dist.all_reduce(t)
            calls += 1
            if self.stop_at.value == calls:
                return calls, int((t != expected).sum())

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class CollectivePeers:
    """This process as rank 0 of a `world_size` process group; a RankPool holds the other ranks,
    which mirror every `all_reduce` this process makes, so the caller times it directly.

        peers = CollectivePeers(2, "gloo")
        t = peers.begin(numel)             # the helpers start following
        peers.reset(t); dist.all_reduce(t) # as many times as you like (reset: untimed)
        wrong = peers.end(t, calls)        # wrong elements, this rank's last result and theirs
        peers.close()
    """

    def __init__(self, world_size: int, backend: str, timeout_s: float = 120.0):
        import sys

        if dist.is_initialized():
            raise RuntimeError("a process group already exists in this process")
        self.world_size, self.backend = world_size, backend
        self.device = torch.device("cuda:0") if backend == "nccl" else torch.device("cpu")
        self._stop_at = mp.get_context("spawn").RawValue("q", 0)
        self.pool = RankPool(_Factory(_Peer, backend, self._stop_at), world_size, first_rank=1)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._excepthook = sys.excepthook  # init_process_group wraps it ("[rank0]: ..." on every line), for good
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{self.pool.port}", rank=0,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        self.pool.wait_ready()
        self._mine = self._expected = None

    def begin(self, numel: int) -> torch.Tensor:
        self._stop_at.value = 0
        self.pool.send("follow", numel)
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
        for rank, (their_calls, their_wrong) in zip(self.pool.ranks, self.pool.collect("follow")):
            if their_calls != calls + 1:
                raise RankPoolError(f"rank {rank} made {their_calls} all_reduce calls, rank 0 made {calls + 1}")
            wrong += their_wrong
        return wrong

    def close(self) -> None:
        import sys

        self.pool.close()
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.excepthook = self._excepthook


# -- scaling -----------------------------------------------------------------------------------

def interleaved_step_times(pools: dict, rounds: int, warmup: int = 0) -> dict[int, list[float]]:
    """Step times of each pool (keyed by rank count), taken in turn: one step at every count, then
    the next round. A machine whose speed drifts (a VM whose host is busy for a minute) then slows
    every count alike, rather than whichever count happened to run during the slow minute, so the
    ratios between counts hold even when the absolute times move."""
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"rounds must be an integer >= 1 and warmup >= 0, got rounds={rounds!r}, warmup={warmup!r}")
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


def speedups(rate: float, base_rate: float, devices: int, base_devices: int = 1) -> tuple[float, float]:
    """(speedup, efficiency) of a throughput against a base throughput: the one formula of the suite."""
    speedup = rate / base_rate
    return speedup, speedup * base_devices / devices


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
        row["speedup"], row["efficiency"] = speedups(row["images_per_s"], base["images_per_s"], row["ranks"],
                                                     base["ranks"])
        row["speedup (fastest steps)"], _ = speedups(per_rank_batch * row["ranks"] / row["step_s_min"],
                                                     per_rank_batch * base["ranks"] / base["step_s_min"],
                                                     row["ranks"], base["ranks"])
    return rows


# -- gated workloads: what the A/B gate times in each arm ----------------------------------------

def run_builders():
    """(make_loaders, make_optimizer_factory) of the mgpu this process imports: a baseline arm
    may run an older mgpu, where make_loaders lived in mgpu.train (now mgpu.run) beside the optimizer factory."""
    try:
        from mgpu.data import make_loaders
    except ImportError:
        from mgpu.train import make_loaders
    try:
        from mgpu.run import make_optimizer_factory
    except ImportError:  # before the run module was named for what it is
        from mgpu.train import make_optimizer_factory
    return make_loaders, make_optimizer_factory


def require_training_api() -> None:
    """Import every name of mgpu's public API the training workloads use, here in the calling
    process: an mgpu without one (older or newer than this harness) raises ImportError or
    AttributeError now, which the A/B gate reports as `not comparable`, rather than inside DDP ranks."""
    from mgpu import devices
    from mgpu.config import TrainConfig  # noqa: F401
    from mgpu.models import build_model  # noqa: F401
    from mgpu.results import EpochStats  # noqa: F401
    from mgpu.strategies import get_strategy  # noqa: F401
    from mgpu.trainer import Trainer

    run_builders()
    for name in ("step", "run_epoch"):
        getattr(Trainer, name)
    getattr(devices, "keep_freed_memory")


class _TrainStep:
    """One training step of a strategy (a DDP rank pool for ddp); check: finite losses, weights moved."""

    def __init__(self, spec: dict):
        require_training_api()
        bench = TrainBench(spec["strategy"], spec["devices"], per_device_batch=spec.get("batch", 32),
                           width=spec.get("width", 16), steps_per_epoch=spec.get("steps_per_epoch", 3),
                           threads_per_device=spec.get("threads_per_device"))
        ranks = _spawns_ranks(bench.strategy)
        if not ranks and bench.threads_per_device:
            torch.set_num_threads(bench.threads_per_device)
        self.session = StrategyRankPool(bench) if ranks else TrainSession(bench)
        self.losses: list[float] = []

    def op(self) -> None:
        self.losses.append(self.session.step())

    def check(self) -> None:
        bad = [v for v in self.losses if not math.isfinite(v)]
        if bad:
            raise AssertionError(f"non-finite losses: {bad[:3]}")
        if self.session.weights_moved() <= 0:
            raise AssertionError("the steps did not change the weights")

    def close(self) -> None:
        self.session.close()


class _TrainEpoch(_TrainStep):
    """One short epoch (a few steps, then evaluation of one test batch)."""

    def op(self) -> None:
        self.losses.append(self.session.epoch().loss)


class _MatmulKernel:
    """The notebook's kernel experiment: `products` products of a size x size matrix with itself."""

    def __init__(self, spec: dict):
        if spec.get("threads"):
            torch.set_num_threads(spec["threads"])
        g = torch.Generator().manual_seed(0)
        self.device = torch.device(spec.get("device", "cpu"))
        self.x = torch.rand(spec.get("size", 384), spec.get("size", 384), generator=g).to(self.device)
        self.products = spec.get("products", 20)
        self.last = None

    def op(self) -> None:
        for _ in range(self.products):
            self.last = self.x.mm(self.x)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def check(self) -> None:
        # Benchmarks run PyTorch's defaults; a machine set to TF32 products (10-bit mantissa) still passes.
        rtol, atol = (2e-2, 1e-1) if self.device.type == "cuda" else (1e-4, 1e-3)
        torch.testing.assert_close(self.last.double(), self.x.double() @ self.x.double(), rtol=rtol, atol=atol)

    def close(self) -> None:
        pass


GATE_KINDS = {"train-step": _TrainStep, "train-epoch": _TrainEpoch, "matmul": _MatmulKernel}


def make_gated(spec: dict):
    """The gated workload of a spec such as {"kind": "train-step", "strategy": "single", "devices": 1}:
    an object with op() (the timed unit), check() (raises if results were wrong) and close()."""
    try:
        cls = GATE_KINDS[spec["kind"]]
    except KeyError:
        raise ValueError(f"unknown gated workload kind {spec.get('kind')!r}: one of {', '.join(GATE_KINDS)}") from None
    return cls(spec)
