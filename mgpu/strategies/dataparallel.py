"""`nn.DataParallel`, as in the chapter: one process scatters each batch over the GPUs.

Without CUDA, `nn.DataParallel` runs the module unchanged on the CPU: a pass-through. This
strategy then uses one CPU device and says so in the run's notes, rather than claim N devices.
"""

from __future__ import annotations

import torch
from torch import nn

from mgpu import devices as devmod
from mgpu.strategies.single import SingleDevice


class _AutocastForward(nn.Module):
    """`module` run under CUDA autocast to `dtype`, in whichever thread calls it."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module, self.dtype = module, dtype

    def forward(self, *inputs):
        with torch.autocast(device_type="cuda", dtype=self.dtype):
            return self.module(*inputs)


class DataParallel(SingleDevice):
    name = "dataparallel"

    @classmethod
    def create(cls, cfg) -> "DataParallel":
        requested = devmod.devices(cfg.devices, require_gpus=cfg.require_gpus, kind=cfg.device)
        strategy = cls(requested if requested[0].type == "cuda" else devmod.DeviceList([torch.device("cpu")]))
        strategy.requested = cfg.devices
        return strategy

    @property
    def passthrough(self) -> bool:
        return self.devices[0].type != "cuda"

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.passthrough:
            # With no CUDA at all, nn.DataParallel is itself a pass-through; with CUDA present
            # but the devices on the CPU, wrapping would demand the model on cuda:0.
            return nn.DataParallel(model) if not torch.cuda.is_available() else model
        if self.autocast_dtype is not None and len(self.devices) > 1:
            # nn.DataParallel runs each replica in a thread of its own and re-enters autocast there
            # without its dtype (float16, CUDA's default): the replicas must enter it themselves.
            model = _AutocastForward(model, self.autocast_dtype)
        return nn.DataParallel(model, device_ids=list(self.devices), output_device=self.devices[0])

    def notes(self) -> list[str]:
        if self.passthrough:
            return [f"dataparallel: nn.DataParallel needs CUDA devices; ran as a pass-through on one CPU "
                    f"device, not on {getattr(self, 'requested', 1)} devices"]
        return super().notes()
