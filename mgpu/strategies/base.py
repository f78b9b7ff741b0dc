"""What a strategy must provide so that one training loop (mgpu/trainer.py) runs them all.

A strategy owns the model replica(s) and optimizer(s) and knows where the data goes. The loop
hands it global batches and never asks which strategy it is:

    X, y = dataset.take(strategy.local_indices(global_batch_indices))
    stats = strategy.forward_backward(X, y, global_batch_size, micro_steps)   # local [loss_sum, correct], main device
    loss_sum, correct = strategy.all_sum(stats).tolist()         # over ranks (DDP) or identity; the one host read
    strategy.optimizer_step()

The sync budget (correctness/test_sync_budget.py): a training step reads the devices from the host
once, for the step's [loss_sum, correct]; between the first replica's forward and the last
replica's backward it reads nothing, so on GPUs every replica's work is queued before the host
waits for any of it. Statistics stay on the devices until that read.

What the model computes comes from outside: `use_objective` sets the loss (a sum over examples)
and the count of correct examples (mgpu.spec.Objective; cross-entropy over class scores by
default), and X is one tensor or a tuple of tensors, the model's positional arguments.
Gradient accumulation (`micro_steps` K): each device's part of the global batch is cut into K
contiguous pieces, run one after the other, and gradients are synchronised once, after the last.

A strategy is built from a device count and the settings it uses, which it keeps as they were given:

    strategy = get_strategy("ddp").create(2, StrategySettings(timeout=30.0))   # or cfg.strategy_settings()
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from typing import Callable, ClassVar

import torch
from torch import nn

from mgpu import devices as devmod
from mgpu.comm import shard_bounds
from mgpu.config import StrategySettings
from mgpu.devices import check_amp, to_device
from mgpu.spec import Objective, as_inputs, batch_length, slice_inputs

OptimizerFactory = Callable[[list], torch.optim.Optimizer]


def cpu_state_dict(module: nn.Module) -> dict:
    """A detached CPU copy of a module's state_dict, so callers can keep it after training goes on."""
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of a tensor on this process: a DTensor's local shard, a plain tensor whole."""
    to_local = getattr(t, "to_local", None)
    local = to_local() if callable(to_local) else t
    return local.numel() * local.element_size()


def micro_batches(X, y: torch.Tensor, micro_steps: int):
    """(X, y) cut into `micro_steps` contiguous pieces, in order (empty pieces left out)."""
    n = y.shape[0]
    for k in range(micro_steps):
        start, stop = shard_bounds(n, micro_steps, k)
        if stop > start:
            yield slice_inputs(X, start, stop), y[start:stop]


class Strategy(ABC):
    """Base: the parts most strategies share. Subclasses override a handful of methods."""

    name: ClassVar[str] = "base"
    spawns_ranks: ClassVar[bool] = False  # whether `launch` starts processes of its own

    def __init__(self, devices: devmod.DeviceList, settings: StrategySettings = StrategySettings()):
        self.devices = devices
        self.settings = settings  # what it was built with: read, never changed (frozen)
        self.rank, self.world_size = 0, 1  # processes, not devices: only DDP has more than one
        self.autocast_dtype: torch.dtype | None = None             # --amp bf16: torch.bfloat16
        self.memory_format: torch.memory_format = torch.contiguous_format  # --channels-last
        self.compile_model = False                                   # --compile: the forward under torch.compile
        self.objective = Objective()  # cross-entropy over class scores, unless use_objective says otherwise

    # -- speed options -------------------------------------------------------------------------
    def use_speed_options(self, amp: str = "off", channels_last: bool = False, compile: bool = False) -> None:
        """--amp, --channels-last and --compile; call before `setup`. The weights and the SGD step stay fp32."""
        check_amp(amp, self.devices)
        self.autocast_dtype = torch.bfloat16 if amp == "bf16" else None
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.compile_model = compile

    def compiled(self, net: nn.Module) -> nn.Module:
        """What a training step's forward runs: `net` (the model as wrapped: DDP, FSDP, DataParallel or
        itself) under torch.compile with --compile, else `net`. The wrapper is compiled, not the model
        inside it: compiled DDP then splits its graph at the gradient buckets (torch's DDPOptimizer) and
        keeps its reducer; compiling the inner module would bypass the allreduce."""
        return torch.compile(net) if self.compile_model else net

    def use_objective(self, objective: Objective) -> None:
        """The loss (summed over examples) and count of correct examples of the model to train."""
        self.objective = objective

    def place(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The model on a device, in the run's memory layout."""
        return model.to(device=device, memory_format=self.memory_format)

    def inputs(self, X, device: torch.device) -> tuple:
        """The model's inputs (a tensor or a tuple of them) on a device, as a tuple of positional
        arguments; images in the run's memory layout; without the host waiting."""
        moved = (to_device(t, device) for t in as_inputs(X))
        return tuple(t.contiguous(memory_format=self.memory_format) if t.dim() == 4 else t for t in moved)

    def autocast(self, device: torch.device):
        """The forward's (and loss's) autocast context: bfloat16 under --amp bf16, else nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    # -- lifecycle -----------------------------------------------------------------------------
    @classmethod
    def preflight(cls, devices: int, settings: StrategySettings) -> None:
        """Checks only this strategy needs, run once by `train()` before `launch` (none here)."""

    @classmethod
    def launch(cls, fn: Callable, job, devices: int, settings: StrategySettings):
        """Run fn(job) where this strategy needs it run: in this process, for all but those that
        start ranks of their own (`spawns_ranks`), where it runs in each of `devices` ranks."""
        return fn(job)

    @classmethod
    def create(cls, devices: int, settings: StrategySettings = StrategySettings()) -> "Strategy":
        """This strategy on `devices` devices, built with `settings`."""
        return cls(devmod.devices(devices, require_gpus=settings.require_gpus, kind=settings.device), settings)

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
    def forward_backward(self, X, y: torch.Tensor, global_batch_size: int, micro_steps: int = 1) -> torch.Tensor:
        """Forward and backward of this process's part of a global batch, in `micro_steps` pieces per
        device; returns the local [loss_sum, correct] as a float tensor on the main device (no host
        read). When it returns, every replica's gradients are those of the global mean loss (DDP
        averages them during the last piece's backward, manual allreduces them once)."""

    @abstractmethod
    def optimizer_step(self) -> None:
        """Apply the update on every replica and clear the gradients."""

    def skip_step(self) -> None:
        """Throw away this step's gradients instead of applying them."""
        for opt in self.optimizers():
            opt.zero_grad(set_to_none=True)

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
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

    def count_correct(self, X, y: torch.Tensor) -> torch.Tensor:
        """Correct predictions over a batch, each device predicting its contiguous shard, as a
        float64 tensor on the main device: the devices' counts meet there without a host read.

        Shards may be empty (a last test batch smaller than the device count): those are skipped.
        """
        modules, main = self.modules(), self.devices[0]
        correct = torch.zeros((), dtype=torch.float64, device=main)
        with torch.no_grad():
            for i, (module, device) in enumerate(zip(modules, self.devices)):
                start, stop = shard_bounds(batch_length(X), len(modules), i)
                if stop > start:
                    with self.autocast(device):
                        output = module(*self.inputs(slice_inputs(X, start, stop), device))
                    hits = self.objective.correct(output, to_device(y[start:stop], device))
                    correct += hits.to(main, non_blocking=True)
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

    def memory_bytes(self) -> dict[str, int]:
        """Bytes one device of this process holds for training state: the parameters, their
        gradients (one per trainable parameter, as a step holds them) and the optimizer state; a
        sharded tensor (FSDP) counts its local shard only. On CUDA also `peak_allocated`, the
        most memory the device had allocated (activations included) since `reset_peak_memory`."""
        params = list(self.modules()[0].parameters())
        state = [t for s in self.optimizers()[0].state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        out = {"parameters": sum(_nbytes(p) for p in params),
               "gradients": sum(_nbytes(p) for p in params if p.requires_grad),
               "optimizer": sum(_nbytes(t) for t in state)}
        device = self.devices[0]
        if device.type == "cuda":
            out["peak_allocated"] = int(torch.cuda.max_memory_allocated(device))
        return out

    def reset_peak_memory(self) -> None:
        """Start `peak_allocated` afresh on this process's GPUs. Called once the model is placed: in
        a process that ran other work first (a pytest session) the peak would otherwise be that
        work's (the H200's first perf run recorded 7 GB for a 0.7 GB training step)."""
        for device in {d for d in self.devices if d.type == "cuda"}:
            torch.cuda.reset_peak_memory_stats(device)

    def load_state_dicts(self, model_state: dict, optimizer_state: dict | None = None) -> None:
        """Load the same weights (and optimizer state) into every replica."""
        for module in self.modules():
            module.load_state_dict(model_state)
        if optimizer_state is not None:
            for opt in self.optimizers():
                # load_state_dict keeps the given tensors: without a copy each, the replicas would
                # share (and each step update) one momentum buffer.
                opt.load_state_dict(copy.deepcopy(optimizer_state))
