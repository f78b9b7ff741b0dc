"""One model on one device: the reference every other strategy must match.

DataParallel and DDP are this strategy with the model wrapped (`wrap`): the step below, with its
gradient accumulation, is theirs too. They override what differs: how much of the global batch
one process's loss stands for (`loss_scale`), and whether a micro-step's backward synchronises
gradients (`gradient_sync`).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from mgpu import devices as devmod
from mgpu.config import StrategySettings
from mgpu.devices import to_device
from mgpu.spec import batch_length
from mgpu.strategies.base import OptimizerFactory, Strategy, micro_batches


class SingleDevice(Strategy):
    name = "single"

    @classmethod
    def create(cls, devices: int, settings: StrategySettings = StrategySettings()) -> "SingleDevice":
        # `devices` is ignored here on purpose: "single" always means the first device.
        return cls(devmod.devices(1, require_gpus=settings.require_gpus, kind=settings.device), settings)

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        self.model = self.place(model, self.devices[0])
        self.wrapped = self.wrap(self.model)     # DDP, FSDP or DataParallel around it (or the model itself)
        self.net = self.compiled(self.wrapped)   # what a training step's forward runs through
        self.optimizer = make_optimizer(list(self.model.parameters()))

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def loss_scale(self, global_batch_size: int) -> float:
        """What this process's summed loss is multiplied by: 1 / global batch size gives the mean."""
        return 1.0 / global_batch_size

    def gradient_sync(self, last_micro_step: bool):
        """The context of a micro-step's backward: only DDP synchronises, and only on the last."""
        return contextlib.nullcontext()

    def forward_backward(self, X, y: torch.Tensor, global_batch_size: int, micro_steps: int = 1) -> torch.Tensor:
        device, scale = self.devices[0], self.loss_scale(global_batch_size)
        stats = torch.zeros(2, device=device)
        pieces = list(micro_batches(X, y, micro_steps))
        for k, (X_piece, y_piece) in enumerate(pieces):
            with self.gradient_sync(last_micro_step=k == len(pieces) - 1):
                with self.autocast(device):
                    y_piece = to_device(y_piece, device)
                    output = self.objective.forward(self.net, self.inputs(X_piece, device), y_piece)
                    loss, piece_stats = self.objective.loss_and_stats(output, y_piece, scale)
                loss.backward()
            stats += piece_stats
        return stats

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def evaluation_net(self) -> nn.Module:
        """What evaluation runs through (DDP: the plain module, whose forward starts no collectives)."""
        return self.net

    def count_correct(self, X, y: torch.Tensor) -> torch.Tensor:
        device = self.devices[0]
        if batch_length(X) == 0:
            return torch.zeros((), dtype=torch.float64, device=device)
        with torch.no_grad(), self.autocast(device):
            output = self.evaluation_net()(*self.inputs(X, device))
        return self.objective.correct(output, to_device(y, device)).to(torch.float64)

    def modules(self) -> list[nn.Module]:
        return [self.model]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]
