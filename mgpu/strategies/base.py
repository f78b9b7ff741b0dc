"""What a strategy must provide so that one training loop (mgpu/train.py) runs them all.

A strategy owns the model replica(s) and optimizer(s) and knows where the data goes. The loop
hands it global batches and never asks which strategy it is:

    X, y = dataset.take(strategy.local_indices(global_batch_indices))
    stats = strategy.forward_backward(X, y, global_batch_size)   # local [loss_sum, correct]
    loss_sum, correct = strategy.all_sum(stats)                  # over ranks (DDP) or identity
    strategy.optimizer_step()
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Callable, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from mgpu import devices as devmod
from mgpu.comm import shard_bounds

OptimizerFactory = Callable[[list], torch.optim.Optimizer]


def cpu_state_dict(module: nn.Module) -> dict:
    """A detached CPU copy of a module's state_dict, so callers can keep it after training goes on."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def sum_loss_and_correct(logits: torch.Tensor, y: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss to backpropagate, detached [loss_sum, correct] on the logits' device).

    The loss summed over the examples, times `scale`: 1 / global batch size gives the mean
    over the global batch whatever the shard sizes are.
    """
    loss_sum = F.cross_entropy(logits, y, reduction="sum")
    correct = (logits.detach().argmax(dim=1) == y).sum()
    return loss_sum * scale, torch.stack([loss_sum.detach().float(), correct.float()])


class Strategy(ABC):
    """Base: the parts most strategies share. Subclasses override a handful of methods."""

    name: ClassVar[str] = "base"
    spawns_ranks: ClassVar[bool] = False  # whether `launch` starts processes of its own

    def __init__(self, devices: devmod.DeviceList):
        self.devices = devices
        self.rank, self.world_size = 0, 1  # processes, not devices: only DDP has more than one

    # -- lifecycle -----------------------------------------------------------------------------
    @classmethod
    def preflight(cls, cfg) -> None:
        """Checks only this strategy needs, run once by `train()` before `launch` (none here)."""

    @classmethod
    def launch(cls, fn: Callable, cfg):
        """Run fn(cfg) where this strategy needs it run; in this process for all but DDP."""
        return fn(cfg)

    @classmethod
    def create(cls, cfg) -> "Strategy":
        return cls(devmod.devices(cfg.devices, require_gpus=cfg.require_gpus))

    @abstractmethod
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        """Place the model (replicas) on the devices and build the optimizer(s)."""

    def teardown(self) -> None:
        pass

    @property
    def is_main(self) -> bool:
        """Only the main process prints and writes files."""
        return self.rank == 0

    def notes(self) -> list[str]:
        """Facts a user must see in the output, e.g. that a strategy fell back to one device."""
        notes = []
        if getattr(self.devices, "emulated", False):
            notes.append(f"{len(self.devices)} devices are emulated on the CPU: results are exact, speed is the CPU's")
        return notes

    def describe_devices(self) -> str:
        return devmod.describe(self.devices)

    # -- training ------------------------------------------------------------------------------
    def local_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """The part of a global batch this process reads (all of it, except under DDP)."""
        return indices

    @abstractmethod
    def forward_backward(self, X: torch.Tensor, y: torch.Tensor, global_batch_size: int) -> torch.Tensor:
        """Forward and backward of this process's part of a global batch; returns the local
        [loss_sum, correct] as a CPU float tensor. When it returns, every replica's gradients are
        those of the global mean loss (DDP averages them during backward, manual allreduces them)."""

    @abstractmethod
    def optimizer_step(self) -> None:
        """Apply the update on every replica and clear the gradients."""

    def skip_step(self) -> None:
        """Throw away this step's gradients instead of applying them."""
        for opt in self.optimizers():
            opt.zero_grad(set_to_none=True)

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_max(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def synchronize(self) -> None:
        devmod.synchronize(self.devices)

    # -- evaluation ----------------------------------------------------------------------------
    def train_mode(self) -> None:
        for m in self.modules():
            m.train()

    def eval_mode(self) -> None:
        for m in self.modules():
            m.eval()

    def count_correct(self, X: torch.Tensor, y: torch.Tensor) -> int:
        """Correct predictions over a batch, each device predicting its contiguous shard.

        Shards may be empty (a last test batch smaller than the device count): those are skipped.
        """
        modules, correct = self.modules(), 0
        with torch.no_grad():
            for i, (module, device) in enumerate(zip(modules, self.devices)):
                start, stop = shard_bounds(X.shape[0], len(modules), i)
                if stop > start:
                    logits = module(X[start:stop].to(device))
                    correct += int((logits.argmax(dim=1).cpu() == y[start:stop]).sum())
        return correct

    # -- state ---------------------------------------------------------------------------------
    @abstractmethod
    def modules(self) -> list[nn.Module]:
        """The plain (unwrapped) model on each device this process drives."""

    @abstractmethod
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizer of each replica, in the order of `modules()`."""

    def model_state_dict(self) -> dict:
        """The main replica's weights and buffers, on the CPU, keys without any wrapper prefix."""
        return cpu_state_dict(self.modules()[0])

    def optimizer_state_dict(self) -> dict:
        return copy.deepcopy(self.optimizers()[0].state_dict())

    def load_state_dicts(self, model_state: dict, optimizer_state: dict | None = None) -> None:
        """Load the same weights (and optimizer state) into every replica."""
        for module in self.modules():
            module.load_state_dict(model_state)
        if optimizer_state is not None:
            for opt in self.optimizers():
                # load_state_dict keeps the given tensors: without a copy each, the replicas would
                # share (and each step update) one momentum buffer.
                opt.load_state_dict(copy.deepcopy(optimizer_state))
