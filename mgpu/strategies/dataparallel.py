"""`nn.DataParallel`, as in the chapter: one process scatters each batch over the GPUs.

Without CUDA, `nn.DataParallel` runs the module unchanged on the CPU: a pass-through. This
strategy then uses one CPU device and says so in the run's notes, rather than claim N devices.
"""

from __future__ import annotations

import torch
from torch import nn

from mgpu import devices as devmod
from mgpu.config import StrategySettings
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

    def __init__(self, devices: devmod.DeviceList, settings: StrategySettings = StrategySettings(),
                 requested: int = 1):
        super().__init__(devices, settings)
        self.requested = requested  # the device count asked for, which the pass-through note names

    @classmethod
    def create(cls, devices: int, settings: StrategySettings = StrategySettings()) -> "DataParallel":
        found = devmod.devices(devices, require_gpus=settings.require_gpus, kind=settings.device)
        return cls(found if found[0].type == "cuda" else devmod.DeviceList([torch.device("cpu")]), settings,
                   requested=devices)

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
                    f"device, not on {self.requested} devices"]
        return super().notes()
