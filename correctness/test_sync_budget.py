"""The sync budget: a training step reads the devices from the host at most once, and never
between the first replica's forward and the last replica's backward; evaluation reads at most
once per test batch, never between devices.

Every host read of a device tensor (`.item`, `.tolist`, `.cpu`, `.numpy`, `float()`, `int()`)
waits for the device: on GPUs a read between two replicas' work serialises them. On a CPU there
is nothing to wait for, so this proxy counts the reads themselves, by instrumenting those methods
during real steps of every strategy, and places them among the replicas' forward calls and
backward launches. On CUDA the same steps also run under `torch.cuda.set_sync_debug_mode("error")`,
with the one allowed read outside it.
"""

from __future__ import annotations

import pytest
import torch

from conftest import requires_gpus
from mgpu.config import TrainConfig
from mgpu.data import BatchLoader
from mgpu.devices import torch_threads
from mgpu.launch import free_port
from mgpu.models import build_model
from mgpu.strategies import get_strategy
from mgpu.data import make_loaders
from mgpu.run import make_optimizer_factory
from mgpu.trainer import LoopSettings, Trainer

# The GPU workflow's correctness step selects this module by its marker, in the same run as the
# GPU-gated properties (one pytest start instead of two).
pytestmark = pytest.mark.sync_budget

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__")
STEPS = 3


class Recorder:
    """Events in order: ("forward", replica), ("backward",) when a backward call has returned
    (its work launched), ("read", method)."""

    def __init__(self):
        self.events: list[tuple] = []
        self.on = False

    def log(self, *event) -> None:
        if self.on:
            self.events.append(event)

    def install(self, monkeypatch, modules) -> None:
        for name in READS:
            original = getattr(torch.Tensor, name)

            def read(tensor, *args, _original=original, _name=name, **kwargs):
                self.log("read", _name)
                return _original(tensor, *args, **kwargs)
            monkeypatch.setattr(torch.Tensor, name, read)
        backward = torch.Tensor.backward

        def traced_backward(tensor, *args, **kwargs):
            out = backward(tensor, *args, **kwargs)
            self.log("backward")
            return out
        monkeypatch.setattr(torch.Tensor, "backward", traced_backward)
        for i, module in enumerate(modules):
            module.register_forward_pre_hook(lambda m, inputs, i=i: self.log("forward", i))

    def take(self) -> list[tuple]:
        events, self.events = self.events, []
        return events


def reads_of(events) -> list[str]:
    return [e[1] for e in events if e[0] == "read"]


def reads_mid_launch(events) -> list[str]:
    """Reads after the first forward and before the last backward launch of a step."""
    kinds = [e[0] for e in events]
    if "forward" not in kinds or "backward" not in kinds:
        return []
    first, last = kinds.index("forward"), len(kinds) - 1 - kinds[::-1].index("backward")
    return [e[1] for e in events[first:last] if e[0] == "read"]


def reads_between_devices(events) -> list[str]:
    """Reads between one replica's forward and the next replica's forward of the same batch."""
    found = []
    for i, e in enumerate(events):
        if e[0] != "read":
            continue
        before = next((f[1] for f in reversed(events[:i]) if f[0] == "forward"), None)
        after = next((f[1] for f in events[i + 1:] if f[0] == "forward"), None)
        if before is not None and after is not None and after > before:
            found.append(e[1])
    return found


CASES = [("single", 1), ("manual", 2), ("manual", 3), ("dataparallel", 1), ("ddp", 1)]


@pytest.fixture
def session(request, monkeypatch):
    """(strategy, trainer, recorder) for a small ResNet-18 with BatchNorm; ddp as one rank in this process."""
    name, n = request.param
    if name == "ddp":
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    cfg = TrainConfig(strategy=name, devices=n, model="resnet18", width=4, batch_size=12, train_size=12 * STEPS,
                      test_size=30, epochs=1, out=None, progress=False).validate()
    with torch_threads():  # ddp's create() takes the cores it would share with other ranks: not here
        strategy = get_strategy(name).create(cfg.devices, cfg.strategy_settings())
    try:
        train_loader, test_loader = make_loaders(cfg)
        strategy.setup(build_model("resnet18", width=4, seed=0), make_optimizer_factory(cfg))
        test_loader = BatchLoader(test_loader.dataset, batch_size=8)  # 4 test batches, the last of 6
        trainer = Trainer(strategy, train_loader, test_loader, LoopSettings(epochs=1, progress=False), log=lambda _: None)
        recorder = Recorder()
        recorder.install(monkeypatch, strategy.modules())
        yield strategy, trainer, recorder
    finally:
        strategy.teardown()


@pytest.mark.parametrize("session", CASES, ids=[f"{s}-{n}" for s, n in CASES], indirect=True)
def test_a_training_step_reads_once_and_never_while_replicas_are_launched(session):
    strategy, trainer, recorder = session
    for step, indices in enumerate(trainer.train_loader.index_batches()):
        recorder.on = True
        trainer.step(indices, 0, step)
        recorder.on = False
        events = recorder.take()
        forwards = [e for e in events if e[0] == "forward"]
        assert len(forwards) == len(strategy.modules()), f"step {step}: instrumentation saw {forwards}"
        assert len(reads_of(events)) <= 1, f"step {step}: {len(reads_of(events))} host reads: {reads_of(events)}"
        assert not reads_mid_launch(events), (f"step {step}: host reads between the first forward and the last "
                                              f"backward launch: {reads_mid_launch(events)} in {events}")


@pytest.mark.parametrize("session", CASES, ids=[f"{s}-{n}" for s, n in CASES], indirect=True)
def test_evaluation_reads_at_most_once_per_batch_and_never_between_devices(session):
    strategy, trainer, recorder = session
    batches = len(trainer.test_loader)
    recorder.on = True
    trainer.evaluate()
    recorder.on = False
    events = recorder.take()
    assert batches == 4, f"{batches} test batches, not the 4 this test means to read"
    assert len(reads_of(events)) <= batches, f"{len(reads_of(events))} reads over {batches} test batches"
    assert not reads_between_devices(events), f"reads between devices: {reads_between_devices(events)} in {events}"


def test_the_instrumentation_sees_a_read_planted_between_replicas(monkeypatch):
    """The proxy can fail: a manual strategy that reads each replica's statistics before launching
    the next (what mgpu did before) is caught."""
    cfg = TrainConfig(strategy="manual", devices=2, model="lenet", batch_size=8, train_size=16, epochs=1, out=None,
                      progress=False).validate()
    strategy = get_strategy("manual").create(cfg.devices, cfg.strategy_settings())
    strategy.setup(build_model("lenet", seed=0), make_optimizer_factory(cfg))
    recorder = Recorder()
    recorder.install(monkeypatch, strategy.modules())
    original = type(strategy.replicas[0]).forward

    def forward_then_read(module, x):
        out = original(module, x)
        out.detach().sum().item()  # the planted host read
        return out
    monkeypatch.setattr(type(strategy.replicas[0]), "forward", forward_then_read)
    train_loader, test_loader = make_loaders(cfg)
    trainer = Trainer(strategy, train_loader, test_loader, LoopSettings(epochs=1, progress=False), log=lambda _: None)
    recorder.on = True
    trainer.step(next(iter(train_loader.index_batches())))
    events = recorder.take()
    assert reads_mid_launch(events) == ["item", "item"], events


@requires_gpus(1)
@pytest.mark.parametrize("name", ["single", "manual", "dataparallel"])
def test_a_cuda_step_syncs_only_for_its_one_read(name):
    """Under set_sync_debug_mode("error"), any synchronising call inside the step raises."""
    n = torch.cuda.device_count() if name != "single" else 1
    cfg = TrainConfig(strategy=name, devices=n, model="resnet18", width=8, batch_size=16, train_size=48, epochs=1,
                      out=None, progress=False, require_gpus=True).validate()
    strategy = get_strategy(name).create(cfg.devices, cfg.strategy_settings())
    strategy.setup(build_model("resnet18", width=8, seed=0), make_optimizer_factory(cfg))
    train_loader, _ = make_loaders(cfg)
    for indices in train_loader.index_batches():
        X, y = train_loader.dataset.take(strategy.local_indices(indices))
        torch.cuda.set_sync_debug_mode("error")
        try:
            stats = strategy.all_sum(strategy.forward_backward(X, y, len(indices)))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(torch.isfinite(torch.tensor(stats.tolist())))  # the one read, outside
        torch.cuda.set_sync_debug_mode("error")
        try:
            strategy.optimizer_step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    strategy.teardown()
