"""The one training loop, and `train(cfg)`: the whole job behind `python -m mgpu train`.

    >>> from mgpu.config import TrainConfig
    >>> from mgpu.train import train
    >>> result = train(TrainConfig(strategy="manual", devices=2, model="lenet", epochs=1,
    ...                            train_size=2048, test_size=512, out=None))
    >>> result.summary_line()
    'test acc: 0.93, 1.9 sec/epoch on [cpu (emulated 0), cpu (emulated 1)]'

`Trainer` never asks which strategy it runs: it hands global batches to the strategy's handful
of methods (see mgpu/strategies/base.py). Epoch time covers training only, measured after
synchronising every device, as the chapter does; evaluation is timed separately.
"""

from __future__ import annotations

import math
import os
import platform
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from tqdm import tqdm

import mgpu
from mgpu import devices as devmod
from mgpu.config import TrainConfig
from mgpu.data import BatchLoader, load_fashion_mnist, synthetic_fashion_mnist
from mgpu.errors import CheckpointError, ConfigError, DeviceError, LaunchError, NonFiniteLossError, ShapeError
from mgpu.models import build_model
from mgpu.strategies import Strategy, get_strategy

__all__ = ["EpochStats", "RunResult", "Trainer", "train", "make_loaders", "make_optimizer_factory", "Fault",
           "FAULT_ENV", "check_model_input"]

FAULT_ENV = "MGPU_FAULT"


@dataclass(frozen=True)
class Fault:
    """TEST HOOK, off unless the environment variable MGPU_FAULT is set: fail on purpose.

        MGPU_FAULT="rank=1,epoch=2,step=1,kind=kill" python -m mgpu train --strategy ddp --devices 2 ...

    makes rank 1 (of any strategy; rank 0 is the only one outside DDP) fail at the start of
    step 1 of epoch 2 (both 1-based, as in error messages). Kinds: `raise` (a RuntimeError),
    `kill` (SIGKILL itself), `exit` (os._exit(3), no report), `hang` (sleep forever, as a
    rank stuck outside a collective), `nan` (that step's input becomes NaN, so the loss is NaN).
    The reliability tests (correctness/test_reliability_*.py) inject faults with it; nothing
    else reads it. rank, epoch and step default to 0, 1 and 1.
    """

    kind: str
    rank: int = 0
    epoch: int = 1
    step: int = 1

    KINDS = ("raise", "kill", "exit", "hang", "nan")

    @classmethod
    def from_env(cls) -> "Fault | None":
        text = os.environ.get(FAULT_ENV, "").strip()
        if not text:
            return None
        try:
            fields = dict(item.split("=", 1) for item in text.replace(" ", "").split(","))
            fault = cls(kind=fields.pop("kind"), **{k: int(v) for k, v in fields.items()})
        except (ValueError, TypeError, KeyError):
            raise ConfigError(f"{FAULT_ENV}={text!r} is not a fault: write kind=KIND[,rank=R][,epoch=E][,step=S] "
                              f"with KIND one of {', '.join(cls.KINDS)}") from None
        if fault.kind not in cls.KINDS:
            raise ConfigError(f"{FAULT_ENV}: unknown kind {fault.kind!r}: choose one of {', '.join(cls.KINDS)}")
        return fault

    def fire(self, rank: int, epoch: int, step: int, X: torch.Tensor) -> torch.Tensor:
        """Called before every step (epoch and step 0-based); returns the step's input."""
        if (rank, epoch + 1, step + 1) != (self.rank, self.epoch, self.step):
            return X
        print(f"mgpu: {FAULT_ENV}: injecting {self.kind} at rank {rank}, epoch {self.epoch}, step {self.step}",
              file=sys.stderr, flush=True)
        if self.kind == "raise":
            raise RuntimeError(f"injected fault ({FAULT_ENV}) at epoch {self.epoch}, step {self.step}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "hang":
            while True:
                time.sleep(1)
        return X * float("nan")


@dataclass
class EpochStats:
    epoch: int              # 1-based
    loss: float             # mean training loss over the epoch's examples
    train_acc: float        # training accuracy, measured during the epoch (train mode)
    test_acc: float         # accuracy over the whole test set after the epoch (eval mode)
    seconds: float          # training time of the epoch, all devices synchronised
    eval_seconds: float     # evaluation time, not part of `seconds`
    images_per_sec: float   # training examples per second of `seconds`
    skipped_steps: int = 0  # steps whose update was skipped for a non-finite loss


@dataclass
class RunResult:
    config: dict
    devices: str
    notes: list[str]
    epochs: list[EpochStats]
    versions: dict
    state_dict: dict = field(repr=False, default_factory=dict)  # final weights, CPU tensors

    @property
    def test_acc(self) -> float:
        return self.epochs[-1].test_acc if self.epochs else float("nan")

    @property
    def sec_per_epoch(self) -> float:
        return sum(e.seconds for e in self.epochs) / len(self.epochs) if self.epochs else float("nan")

    def summary_line(self) -> str:
        """The chapter's closing line."""
        return f"test acc: {self.test_acc:.2f}, {self.sec_per_epoch:.1f} sec/epoch on {self.devices}"

    def to_json(self) -> dict:
        return {"summary": self.summary_line(), "test_acc": self.test_acc, "sec_per_epoch": self.sec_per_epoch,
                "devices": self.devices, "notes": self.notes, "config": self.config,
                "epochs": [asdict(e) for e in self.epochs], "versions": self.versions}


class Trainer:
    """Runs epochs of a strategy over global batches; the strategy does all device work."""

    def __init__(self, strategy: Strategy, train_loader: BatchLoader, test_loader: BatchLoader, epochs: int,
                 on_nonfinite: str = "error", progress: bool = True, log: Callable[[str], None] = print,
                 start_epoch: int = 0, on_epoch_end: Callable[[int, EpochStats], None] | None = None):
        self.strategy, self.train_loader, self.test_loader = strategy, train_loader, test_loader
        self.epochs, self.on_nonfinite, self.start_epoch = epochs, on_nonfinite, start_epoch
        self.progress = progress and strategy.is_main
        self.log = log if strategy.is_main else (lambda _: None)
        self.on_epoch_end = on_epoch_end
        self.fault = Fault.from_env()  # a test hook; None unless MGPU_FAULT is set

    def _run_batch(self, indices: torch.Tensor, epoch: int, step: int) -> tuple[float, float, bool]:
        """One step on a global batch; returns (loss_sum, correct, skipped) over the global batch."""
        s = self.strategy
        X, y = self.train_loader.dataset.take(s.local_indices(indices))
        if self.fault is not None:
            X = self.fault.fire(s.rank, epoch, step, X)
        loss_sum, correct = s.all_sum(s.forward_backward(X, y, len(indices))).tolist()
        if not math.isfinite(loss_sum):
            if self.on_nonfinite == "error":
                raise NonFiniteLossError(f"loss is {loss_sum} at epoch {epoch + 1}, step {step + 1}: training stopped "
                                         "(lower the learning rate, or pass --on-nonfinite skip to skip such steps)")
            s.skip_step()
            return 0.0, 0.0, True
        s.optimizer_step()
        return loss_sum, correct, False

    def _run_epoch(self, epoch: int) -> EpochStats:
        s = self.strategy
        self.train_loader.set_epoch(epoch)
        s.train_mode()
        loss_sum = correct = seen = 0.0
        skipped = 0
        bar = tqdm(total=len(self.train_loader), desc=f"epoch {epoch + 1}/{self.epochs}", unit="batch",
                   file=sys.stderr, leave=False, disable=not self.progress, dynamic_ncols=True)
        s.synchronize()
        start = time.perf_counter()
        for step, indices in enumerate(self.train_loader.index_batches()):
            batch_loss, batch_correct, was_skipped = self._run_batch(indices, epoch, step)
            skipped += was_skipped
            if not was_skipped:
                loss_sum, correct, seen = loss_sum + batch_loss, correct + batch_correct, seen + len(indices)
            bar.update(1)
            bar.set_postfix(loss=f"{loss_sum / max(seen, 1):.3f}", refresh=False)
        s.synchronize()
        seconds = float(s.all_max(torch.tensor([time.perf_counter() - start], dtype=torch.float64)))
        bar.close()
        eval_start = time.perf_counter()
        test_acc = self.evaluate()
        return EpochStats(epoch=epoch + 1, loss=loss_sum / max(seen, 1), train_acc=correct / max(seen, 1),
                          test_acc=test_acc, seconds=seconds, eval_seconds=time.perf_counter() - eval_start,
                          images_per_sec=seen / seconds if seconds > 0 else float("nan"), skipped_steps=skipped)

    def evaluate(self, loader: BatchLoader | None = None) -> float:
        """Accuracy over every example of the loader (default: the test set), on all devices."""
        loader = loader or self.test_loader
        s = self.strategy
        s.eval_mode()
        correct = 0
        for indices in loader.index_batches():
            X, y = loader.dataset.take(s.local_indices(indices))
            correct += s.count_correct(X, y)
        s.train_mode()
        total = s.all_sum(torch.tensor([correct], dtype=torch.float64))
        return float(total) / len(loader.dataset)

    def train(self) -> list[EpochStats]:
        history = []
        for epoch in range(self.start_epoch, self.epochs):
            stats = self._run_epoch(epoch)
            history.append(stats)
            skipped = f", {stats.skipped_steps} step(s) skipped (non-finite loss)" if stats.skipped_steps else ""
            self.log(f"epoch {stats.epoch}/{self.epochs}: loss {stats.loss:.4f}, train acc {stats.train_acc:.3f}, "
                     f"test acc {stats.test_acc:.3f}, {stats.seconds:.1f} s ({stats.images_per_sec:.0f} img/s){skipped}")
            if self.on_epoch_end is not None:
                self.on_epoch_end(epoch, stats)
        return history


def make_loaders(cfg: TrainConfig) -> tuple[BatchLoader, BatchLoader]:
    if cfg.data == "synthetic":
        return synthetic_fashion_mnist(cfg.batch_size, train_size=cfg.train_size or 60_000,
                                       test_size=cfg.test_size or 10_000, seed=cfg.seed, resize=cfg.resize)
    train_loader, test_loader = load_fashion_mnist(cfg.batch_size, root=cfg.data_dir, download=cfg.download,
                                                   resize=cfg.resize, seed=cfg.seed)
    train_loader.dataset = train_loader.dataset.head(cfg.train_size)
    test_loader.dataset = test_loader.dataset.head(cfg.test_size)
    if len(train_loader) == 0:
        raise ConfigError(f"{len(train_loader.dataset)} training examples do not fill one global batch "
                          f"of {cfg.batch_size}")
    return train_loader, test_loader


def make_optimizer_factory(cfg: TrainConfig) -> Callable[[list], torch.optim.Optimizer]:
    """The same SGD for every strategy and every replica."""
    return lambda params: torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def versions() -> dict:
    return {"mgpu": mgpu.__version__, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "platform": platform.platform()}


def _checkpoint_saver(cfg: TrainConfig, strategy: Strategy, done: list[EpochStats]) -> Callable[[int, EpochStats], None]:
    """The Trainer's end-of-epoch hook that writes a checkpoint (rank 0 only; every rank holds the same weights)."""
    from mgpu import checkpoint

    history = list(done)

    def save(epoch: int, stats: EpochStats) -> None:
        history.append(stats)
        if strategy.is_main:
            checkpoint.save(cfg.checkpoint_dir, cfg=cfg, epoch=epoch + 1, model_state=strategy.model_state_dict(),
                            optimizer_state=strategy.optimizer_state_dict(), history=[asdict(e) for e in history])
    return save


def _run_in_process(cfg: TrainConfig) -> RunResult | None:
    """Everything one process does; under DDP every rank runs this."""
    from mgpu import checkpoint, launch, results

    if launch.under_launcher():
        # tqdm's default lock is a multiprocessing semaphore; a rank stopped by SIGTERM would leave
        # it behind (and a "leaked semaphore" warning). A rank's bars never span processes.
        tqdm.set_lock(threading.RLock())
    devmod.keep_freed_memory()  # activation buffers reused across steps, not faulted in anew
    strategy = get_strategy(cfg.strategy).create(cfg)
    try:
        log = print if strategy.is_main else (lambda _: None)
        for note in strategy.notes():
            log(f"note: {note}")
        train_loader, test_loader = make_loaders(cfg)
        strategy.setup(build_model(cfg.model, width=cfg.width, seed=cfg.seed), make_optimizer_factory(cfg))
        done: list[EpochStats] = []  # epochs completed before this process started
        start_epoch = 0
        if cfg.resume:
            ckpt = checkpoint.load_for(cfg)
            path = checkpoint.checkpoint_path(cfg.checkpoint_dir)
            if ckpt is None:
                log(f"note: no checkpoint in {cfg.checkpoint_dir}: starting from epoch 1")
            else:
                try:
                    strategy.load_state_dicts(ckpt["model"], ckpt["optimizer"])
                    done = [EpochStats(**e) for e in ckpt["history"]]
                except (RuntimeError, KeyError, ValueError, TypeError) as e:
                    raise CheckpointError(f"checkpoint {path} does not fit this model: "
                                          f"{str(e).strip().splitlines()[0]}") from None
                checkpoint.set_rng_state(ckpt["rng"])
                start_epoch = ckpt["epoch"]
                log(f"note: resuming from {path} after epoch {start_epoch} "
                    f"({max(cfg.epochs - start_epoch, 0)} epoch(s) left)")
        on_epoch_end = _checkpoint_saver(cfg, strategy, done) if cfg.checkpoint_dir else None
        trainer = Trainer(strategy, train_loader, test_loader, cfg.epochs, on_nonfinite=cfg.on_nonfinite,
                          progress=cfg.progress, log=log, start_epoch=start_epoch, on_epoch_end=on_epoch_end)
        history = done + trainer.train()
        result = RunResult(config=cfg.to_dict(), devices=strategy.describe_devices(), notes=strategy.notes(),
                           epochs=history, versions=versions(), state_dict=strategy.model_state_dict())
        if strategy.is_main:
            if cfg.out:
                results.write_results(cfg.out, result)
            log(result.summary_line())
        return result if strategy.is_main else None
    finally:
        strategy.teardown()


def check_model_input(cfg: TrainConfig) -> None:
    """ShapeError when the model cannot take the run's images (e.g. LeNet and --resize 32).

    Runs the model once on a blank image on the CPU (a fraction of a second for ResNet-18 at
    28x28), leaving the caller's RNG state as it was.
    """
    side = cfg.resize or 28
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            out = build_model(cfg.model, width=cfg.width).eval()(torch.zeros(1, 1, side, side))
    except (RuntimeError, ValueError) as e:
        how = f"--resize {cfg.resize}" if cfg.resize else "the data"
        raise ShapeError(f"model {cfg.model} cannot take 1x{side}x{side} images (from {how}): "
                         f"{str(e).strip().splitlines()[0]}") from None
    if tuple(out.shape) != (1, 10):
        raise ShapeError(f"model {cfg.model} gives outputs of shape {tuple(out.shape[1:])} for 1x{side}x{side} "
                         "images, not 10 class scores")


def train(cfg: TrainConfig) -> RunResult:
    """Validate the settings, check data, output folders and checkpoint, and run the job with its strategy.

    Every bad input is found here, before any rank starts, as an MgpuError subclass (see
    docs/failures.md); a failing rank then is a LaunchError, a NaN/Inf loss a NonFiniteLossError.
    """
    from mgpu import checkpoint, devices, launch, results

    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"train() needs a TrainConfig, got {type(cfg).__name__}")
    cfg.validate()
    strategy_cls = get_strategy(cfg.strategy)
    Fault.from_env()  # a malformed test hook fails here, once
    check_model_input(cfg)
    if cfg.out:
        results.check_writable(cfg.out)
    if cfg.checkpoint_dir:
        results.check_writable(cfg.checkpoint_dir, what="checkpoint folder")
        if cfg.resume:
            checkpoint.load_for(cfg)  # corrupt, truncated or foreign: fail now, not in every rank
        elif checkpoint.checkpoint_path(cfg.checkpoint_dir).exists():
            raise CheckpointError(f"{checkpoint.checkpoint_path(cfg.checkpoint_dir)} already exists: pass --resume "
                                  "to continue that run, or choose an empty --checkpoint-dir")
    if strategy_cls.spawns_ranks and not launch.under_launcher():  # checked once here, not in every rank
        if cfg.data == "fashion-mnist":
            make_loaders(cfg)  # missing, corrupt or too few files fail (or download) once, before the ranks
        if cfg.sync_bn and devices.gpu_count() < cfg.devices:
            raise DeviceError(f"--sync-bn needs a CUDA device per rank: {cfg.devices} ranks, "
                              f"{devices.gpu_count()} CUDA device(s) found")
        if cfg.port is not None:
            try:
                launch.check_port_free(cfg.port)
            except LaunchError as e:
                raise ConfigError(str(e)) from None
    return strategy_cls.launch(_run_in_process, cfg)
