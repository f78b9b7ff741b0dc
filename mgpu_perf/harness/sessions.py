"""Training sessions: mgpu's Trainer stepping a strategy on demand, and the same step as bare PyTorch.

    session = TrainSession(TrainBench("manual", 2, width=16))
    session.step()                              # one global batch through mgpu's Trainer

This module reaches mgpu only through its public API (TrainConfig, get_strategy, build_model,
make_loaders, make_optimizer_factory, Trainer): the A/B gate runs it in workers whose `mgpu` comes
from another tree (the baseline), as asv runs today's benchmarks against each commit. Where that API
changed, both forms are used: a strategy built from its settings or from the TrainConfig
(`create_strategy`), a Trainer given LoopSettings or keywords (`_trainer`).

Scaling here is weak scaling: the per-device batch is fixed, the global batch grows with the device
count. On a CPU every emulated device (replica or rank) gets the same share of the cores at every
device count (`threads_per_device`), so a speedup measures parallel execution, not extra threads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["cpu_cores", "TrainBench", "TrainSession", "BareStep", "run_builders", "require_training_api"]


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
    compile: bool = False            # --compile: torch.compile (inductor) around the model
    shard: str = "block"             # fsdp: --shard block | model
    reshard_after_forward: str = "on"  # fsdp: --reshard-after-forward on | off

    @property
    def global_batch(self) -> int:
        return self.per_device_batch * self.devices

    def open(self, strategy=None) -> "TrainSession":
        """A session of this benchmark (in a rank of a pool: with that rank's strategy)."""
        return TrainSession(self, strategy)

    def create_strategy(self):
        """The benchmark's strategy, built from its TrainConfig's settings (a rank's, in a rank)."""
        from mgpu_perf.harness.models import create_strategy

        return create_strategy(self.train_config())

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

        from mgpu_perf.harness.models import create_strategy, use_speed_options

        make_loaders, make_optimizer_factory = run_builders()
        cfg = bench.train_config()
        devmod.keep_freed_memory()  # as `python -m mgpu train` does
        self.bench = bench
        self.strategy = strategy or create_strategy(cfg)
        use_speed_options(self.strategy, bench.amp, bench.channels_last, bench.compile)
        train_loader, test_loader = make_loaders(cfg)
        model = build_model(cfg.model, width=cfg.width, seed=cfg.seed)
        self.initial = [p.detach().clone() for p in model.parameters()]  # CPU copies, before any update
        self.strategy.setup(model, make_optimizer_factory(cfg))
        reset_peak = getattr(self.strategy, "reset_peak_memory", None)  # a baseline arm's mgpu may predate it
        if reset_peak is not None:
            reset_peak()
        self.trainer = _trainer(self.strategy, train_loader, test_loader)
        self.batches = list(train_loader.index_batches())
        self.dataset = train_loader.dataset
        self.steps = self.epochs = 0
        self.graph = None

    def use_graphs(self, mode: str) -> dict:
        """CUDA-graph replays of the step from here on, where it can be captured (harness/graphs.py).
        A replayed step is the strategy's forward_backward and optimizer_step on the batch's tensors,
        without the Trainer's host side (gathering the batch, the one host read), which a graph cannot hold."""
        from mgpu_perf.harness.graphs import GraphStep, graph_state, why_not_captured

        self.graph, why = None, None
        if mode != "off":
            why = why_not_captured(self.strategy, mode, self.bench.compile)
            if why is None:
                from mgpu.errors import one_line

                batches = [self.dataset.take(indices) for indices in self.batches]
                try:
                    self.graph = GraphStep(self.strategy, batches, self.bench.global_batch, start=self.steps,
                                           on_step=self._counted)
                except Exception as e:
                    why = f"capture failed: {one_line(e, with_type=True)}"[:300]
        return graph_state(self.graph is not None, why or ("off (asked)" if mode == "off" else None), mode,
                           self.strategy.devices[0].type == "cuda")

    def _counted(self, stats) -> float:
        self.steps += 1
        loss = float(stats[0]) / self.bench.global_batch
        if loss != loss or loss in (float("inf"), float("-inf")):
            raise FloatingPointError(f"loss {loss} at step {self.steps} under {self.bench.strategy}")
        return loss

    def step(self) -> float:
        """One training step on the next global batch; returns its mean loss (a non-finite one raises)."""
        if self.graph is not None:
            stats = self.graph.step()
            self.strategy.synchronize()
            return self._counted(stats)
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


def _trainer(strategy, train_loader, test_loader):
    """mgpu's Trainer over the strategy for one quiet epoch: given LoopSettings, or, in a baseline
    arm whose mgpu predates them, the same settings as keywords."""
    from mgpu.trainer import Trainer

    try:
        from mgpu.trainer import LoopSettings
    except ImportError:  # an older mgpu: Trainer(..., epochs=1, progress=False)
        return Trainer(strategy, train_loader, test_loader, epochs=1, progress=False, log=lambda _: None)
    return Trainer(strategy, train_loader, test_loader, LoopSettings(epochs=1, progress=False), log=lambda _: None)


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


