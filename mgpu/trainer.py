"""The one training loop: a `Trainer` built from a strategy, two loaders and callbacks.

    trainer = Trainer(strategy, train_loader, test_loader, LoopSettings(epochs=2), callbacks=[CheckpointSaver(...)])
    history = trainer.fit()                      # every epoch: train, evaluate, callbacks
    result = trainer.step(indices)               # or one global batch at a time (benchmarks do)

The Trainer never asks which strategy it runs: it hands global batches to the strategy's handful
of methods (see mgpu/strategies/base.py). It reads no environment variables and writes no files;
what happens around an epoch (checkpoints, the MGPU_FAULT test hook) comes in as callbacks.
Epoch time covers training only, measured after synchronising every device and taken as the
slowest rank's, as the chapter does; evaluation is timed separately.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from tqdm import tqdm

from mgpu.config import LoopSettings
from mgpu.errors import NonFiniteLossError
from mgpu.results import EpochStats

if TYPE_CHECKING:  # for the hints only: the loop imports no strategy
    from mgpu.data import BatchLoader
    from mgpu.strategies.base import Strategy

__all__ = ["Callback", "LoopSettings", "StepResult", "Trainer"]


class Callback:
    """Hooks a Trainer calls; override the ones you need (epoch and step are 0-based)."""

    def before_step(self, trainer: "Trainer", epoch: int, step: int, X: torch.Tensor) -> torch.Tensor:
        """Called with this process's part of the batch before each step; returns the input to use."""
        return X

    def on_epoch_end(self, trainer: "Trainer", epoch: int, stats: EpochStats) -> None:
        """Called after each epoch's evaluation, on every rank."""


@dataclass(frozen=True)
class StepResult:
    loss_sum: float   # summed loss over the global batch (0 when skipped)
    correct: float    # correct predictions over the global batch (0 when skipped)
    examples: int     # examples in the global batch
    skipped: bool     # the update was skipped for a non-finite loss

    @property
    def loss(self) -> float:
        return self.loss_sum / self.examples


class Trainer:
    """Runs steps and epochs of a strategy over global batches; the strategy does all device work."""

    def __init__(self, strategy: "Strategy", train_loader: "BatchLoader", test_loader: "BatchLoader",
                 settings: LoopSettings, log: Callable[[str], None] = print, callbacks: Sequence[Callback] = ()):
        self.strategy, self.train_loader, self.test_loader = strategy, train_loader, test_loader
        self.settings = settings
        self.progress = settings.progress and strategy.is_main  # bars on the main process only
        self.log = log if strategy.is_main else (lambda _: None)
        self.callbacks = list(callbacks)

    def step(self, indices: torch.Tensor, epoch: int = 0, step: int = 0) -> StepResult:
        """One training step on a global batch (indices into the training set)."""
        s = self.strategy
        X, y = self.train_loader.dataset.take(s.local_indices(indices))
        for callback in self.callbacks:
            X = callback.before_step(self, epoch, step, X)
        # The step's one host read, after every replica's backward has been launched (see
        # mgpu/strategies/base.py: the sync budget); the NaN/Inf check rides on it.
        loss_sum, correct = s.all_sum(s.forward_backward(X, y, len(indices), self.settings.accumulate)).tolist()
        if not math.isfinite(loss_sum):
            if self.settings.on_nonfinite == "error":
                raise NonFiniteLossError(f"loss is {loss_sum} at epoch {epoch + 1}, step {step + 1}: training stopped "
                                         "(lower the learning rate, or pass --on-nonfinite skip to skip such steps)")
            s.skip_step()
            return StepResult(0.0, 0.0, len(indices), True)
        s.optimizer_step()
        return StepResult(loss_sum, correct, len(indices), False)

    def run_epoch(self, epoch: int) -> EpochStats:
        """Train one epoch (0-based number: it seeds the batch order), then evaluate."""
        s = self.strategy
        self.train_loader.set_epoch(epoch)
        s.train_mode()
        loss_sum = correct = seen = 0.0
        skipped = 0
        bar = tqdm(total=len(self.train_loader), desc=f"epoch {epoch + 1}/{self.settings.epochs}", unit="batch",
                   file=sys.stderr, leave=False, disable=not self.progress, dynamic_ncols=True)
        s.synchronize()
        start = time.perf_counter()
        for step, indices in enumerate(self.train_loader.index_batches()):
            result = self.step(indices, epoch, step)
            skipped += result.skipped
            if not result.skipped:
                loss_sum, correct, seen = loss_sum + result.loss_sum, correct + result.correct, seen + result.examples
            bar.update(1)
            bar.set_postfix(loss=f"{loss_sum / max(seen, 1):.3f}", refresh=False)
        s.synchronize()
        # The slowest rank's wall time: the epoch is over when the last rank is done. Every rank's own
        # time travels in its slot of a vector summed over the ranks (one collective), so results.json
        # shows each one beside the maximum it reports.
        rank_seconds = torch.zeros(s.world_size, dtype=torch.float64)
        rank_seconds[s.rank] = time.perf_counter() - start
        rank_seconds = s.all_sum(rank_seconds).tolist()
        seconds = max(rank_seconds)
        bar.close()
        eval_start = time.perf_counter()
        test_acc = self.evaluate()
        return EpochStats(epoch=epoch + 1, loss=loss_sum / max(seen, 1), train_acc=correct / max(seen, 1),
                          test_acc=test_acc, seconds=seconds, eval_seconds=time.perf_counter() - eval_start,
                          images_per_sec=seen / seconds if seconds > 0 else float("nan"), skipped_steps=skipped,
                          rank_seconds=rank_seconds)

    def evaluate(self, loader: "BatchLoader | None" = None) -> float:
        """Accuracy over every example of the loader (default: the test set), on all devices."""
        loader = loader or self.test_loader
        s = self.strategy
        s.eval_mode()
        correct = None  # counts stay on the main device; one host read for the whole evaluation
        for indices in loader.index_batches():
            X, y = loader.dataset.take(s.local_indices(indices))
            batch_correct = s.count_correct(X, y)
            correct = batch_correct if correct is None else correct + batch_correct
        s.train_mode()
        if correct is None:  # no batch at all
            correct = torch.zeros((), dtype=torch.float64, device=s.devices[0])
        total = s.all_sum(correct.to(torch.float64).reshape(1))
        return float(total) / len(loader.dataset)

    def fit(self, start_epoch: int = 0) -> list[EpochStats]:
        """Epochs start_epoch+1 .. epochs (1-based), each followed by the callbacks' on_epoch_end."""
        history = []
        epochs = self.settings.epochs
        for epoch in range(start_epoch, epochs):
            stats = self.run_epoch(epoch)
            history.append(stats)
            skipped = f", {stats.skipped_steps} step(s) skipped (non-finite loss)" if stats.skipped_steps else ""
            self.log(f"epoch {stats.epoch}/{epochs}: loss {stats.loss:.4f}, train acc {stats.train_acc:.3f}, "
                     f"test acc {stats.test_acc:.3f}, {stats.seconds:.1f} s ({stats.images_per_sec:.0f} img/s){skipped}")
            for callback in self.callbacks:
                callback.on_epoch_end(self, epoch, stats)
        return history
