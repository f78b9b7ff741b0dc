"""One model on one device: the reference every other strategy must match."""

from __future__ import annotations

import torch
from torch import nn

from mgpu import devices as devmod
from mgpu.devices import to_device
from mgpu.strategies.base import OptimizerFactory, Strategy, sum_loss_and_correct


class SingleDevice(Strategy):
    name = "single"

    @classmethod
    def create(cls, cfg) -> "SingleDevice":
        # --devices is ignored here on purpose: "single" always means the first device.
        return cls(devmod.devices(1, require_gpus=cfg.require_gpus))

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        self.model = self.place(model, self.devices[0])
        self.net = self.wrap(self.model)  # what forward runs through
        self.optimizer = make_optimizer(list(self.model.parameters()))

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def forward_backward(self, X: torch.Tensor, y: torch.Tensor, global_batch_size: int) -> torch.Tensor:
        device = self.devices[0]
        with self.autocast(device):
            loss, stats = sum_loss_and_correct(self.net(self.inputs(X, device)), to_device(y, device),
                                               1.0 / global_batch_size)
        loss.backward()
        return stats

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def count_correct(self, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        device = self.devices[0]
        if X.shape[0] == 0:
            return torch.zeros((), dtype=torch.int64, device=device)
        with torch.no_grad(), self.autocast(device):
            logits = self.net(self.inputs(X, device))
        return (logits.argmax(dim=1) == to_device(y, device)).sum()

    def modules(self) -> list[nn.Module]:
        return [self.model]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]
