"""`DistributedDataParallel`: one process per device, gradients averaged during backward.

    python -m mgpu train --strategy ddp --devices 2                         # mgpu starts the ranks
    torchrun --nproc-per-node 2 -m mgpu train --strategy ddp               # torchrun starts them
    torchrun --nnodes 2 --node-rank R --master-addr HOST --nproc-per-node 4 -m mgpu train --strategy ddp

gloo on CPUs (each rank limited to its share of the cores), nccl on GPUs. Each rank reads only
its contiguous part of every global batch. DDP averages gradients over ranks, so each rank scales
its summed loss by world_size / global batch size: the average then equals the gradient of the
global mean loss, uneven shards included. With gradient accumulation, every micro-step but the
last runs under `no_sync`: gradients are averaged once per step.

The training step is SingleDevice's, with the model wrapped in DDP; evaluation runs the plain
module (DDP's forward would start collectives, and ranks may hold different numbers of batches).
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from mgpu import devices as devmod
from mgpu import launch
from mgpu.comm import all_sum, shard_bounds
from mgpu.config import StrategySettings
from mgpu.errors import ConfigError, DeviceError, LaunchError
from mgpu.strategies.base import OptimizerFactory
from mgpu.strategies.single import SingleDevice


def setup_process_group(backend: str, timeout_s: float) -> None:
    """Join the group described by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=timeout_s))


def rank_device(local_rank: int, local_world_size: int, require_gpus: bool, kind: str = "auto") -> tuple[torch.device, str]:
    """(device, backend) of this rank: cuda:LOCAL_RANK and nccl when this machine has a GPU for every
    local rank, else the CPU and gloo for all of them (mixing nccl and gloo ranks in one group cannot
    work). The rule: mgpu.devices.rank_placement."""
    return devmod.rank_placement(local_rank, local_world_size, devmod.gpu_count(), "cuda" if require_gpus else kind)


def _device_identity(device: torch.device) -> str:
    """What tells two GPUs apart across processes: the GPU's UUID (cuda:0 of two processes with
    other CUDA_VISIBLE_DEVICES are two GPUs), else the device's name."""
    if device.type == "cuda":
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is not None:
            return f"cuda {uuid}"
    return str(device)


def check_gpu_per_rank(device: torch.device, rank: int, world_size: int) -> list[str]:
    """Every rank's device (for describe_devices), exchanged through the process group's store
    before any collective: two ranks on one GPU of one host are refused here in one line, where
    NCCL would fail at its first collective ("Duplicate GPU detected"). That happens with two
    torchrun agents on a machine with one GPU: each sees one local rank and takes cuda:0."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"mgpu/placement/{rank}", "\t".join([socket.gethostname(), _device_identity(device), str(device)]))
    rows = [store.get(f"mgpu/placement/{r}").decode().split("\t") for r in range(world_size)]
    clashes = devmod.shared_gpus([(host, identity) for host, identity, _ in rows])
    if clashes:
        a, b, _ = clashes[0]
        raise DeviceError(f"ranks {a} and {b} were both given {rows[a][2]} on {rows[a][0]}: NCCL needs a GPU of its own "
                          "for every rank; start no more ranks on a machine than it has GPUs, or run on the CPU with "
                          "--device cpu (gloo)")
    return [name for _, _, name in rows]


class DistributedDataParallel(SingleDevice):
    name = "ddp"
    spawns_ranks = True

    def __init__(self, devices: devmod.DeviceList, settings: StrategySettings = StrategySettings(), *,
                 rank: int, world_size: int, rank_devices: list[str]):
        super().__init__(devices, settings)
        self.rank, self.world_size = rank, world_size
        self.rank_devices = rank_devices  # every rank's device, by rank (describe_devices)

    @classmethod
    def launch(cls, fn, job, devices: int, settings: StrategySettings):
        if launch.under_launcher():
            return fn(job)  # torchrun (or our own spawn) already started this rank
        # Fail here, once, not in every rank:
        devmod.devices(devices, require_gpus=settings.require_gpus, kind=settings.device)
        return launch.spawn(fn, job, nprocs=devices, port=settings.port)

    @classmethod
    def preflight(cls, devices: int, settings: StrategySettings) -> None:
        """Checked once before the ranks start, not in every rank (nothing to do inside torchrun's ranks).
        What the run's data and speed options need of the ranks' devices the run checks (mgpu/preflight.py)."""
        if launch.under_launcher():
            return
        if settings.sync_bn and devmod.gpu_count() < devices:
            raise DeviceError(f"--sync-bn needs a CUDA device per rank: {devices} ranks, "
                              f"{devmod.gpu_count()} CUDA device(s) found")
        if settings.port is not None:
            try:
                launch.check_port_free(settings.port)
            except LaunchError as e:
                raise ConfigError(str(e)) from None

    @classmethod
    def create(cls, devices: int, settings: StrategySettings = StrategySettings()) -> "DistributedDataParallel":
        """This rank's strategy, inside ranks a launcher started: the world is the launcher's (WORLD_SIZE),
        so `devices` is not read, nor is `settings.port` (the launcher's MASTER_PORT is)."""
        if not launch.under_launcher():
            raise ConfigError("the ddp strategy runs inside ranks: start it with DistributedDataParallel.launch, "
                              "`python -m mgpu train --strategy ddp`, or torchrun")
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        device, backend = rank_device(local_rank, local_world, settings.require_gpus, settings.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            # Ranks on one machine share its cores (those this process may use: its affinity mask,
            # as taskset, cgroups or a batch scheduler set it): oversubscribing them would serialise the ranks.
            torch.set_num_threads(max(1, len(devmod.usable_cores()) // local_world))
        if not dist.is_initialized():  # else a strategy before this one in the same ranks set it up (mgpu check)
            setup_process_group(backend, settings.timeout)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        return cls(devmod.DeviceList([device]), settings, rank=rank, world_size=world_size,
                   rank_devices=check_gpu_per_rank(device, rank, world_size))

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory) -> None:
        if self.settings.sync_bn:
            if self.devices[0].type != "cuda":
                raise DeviceError("SyncBatchNorm needs CUDA devices; it refuses CPU tensors")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        super().setup(model, make_optimizer)
        self.ddp = self.wrapped

    def wrap(self, model: nn.Module) -> nn.Module:
        device = self.devices[0]
        # Gradients as views into DDP's buckets: no copy into and out of the buckets each step
        # (the figure it bought on 2 CPU cores is in docs/notes/perf.md).
        return DDP(model, device_ids=[device] if device.type == "cuda" else None, gradient_as_bucket_view=True,
                   find_unused_parameters=self.settings.find_unused_parameters)

    def teardown(self) -> None:
        """The model, its wrapper and the optimizer released first, then the process group. Left to
        the interpreter's exit, the last collective's work object (held by DDP's reducer, FSDP's
        state) is freed after the group is destroyed, while gloo's worker thread still runs: then
        "terminate called without an active exception" aborts the rank (torch 2.14 under torchrun;
        the runs that showed it: docs/notes/suite-times.md, 2026-11-28), its agent fails, and
        on several nodes the other agents wait out torch's exit barrier (300 s) after training."""
        for name in ("net", "wrapped", "ddp", "fsdp", "model", "optimizer"):
            if name in vars(self):
                setattr(self, name, None)
        gc.collect()  # the modules' cycles (hooks hold their modules) go now, while the group lives
        if dist.is_initialized():
            dist.destroy_process_group()

    def describe_devices(self) -> str:
        if all(n == "cpu" for n in self.rank_devices):
            return "[" + ", ".join(f"cpu (rank {r})" for r in range(self.world_size)) + "]"
        return "[" + ", ".join(f"{n} (rank {r})" for r, n in enumerate(self.rank_devices)) + "]"

    def notes(self) -> list[str]:
        if self.devices[0].type == "cpu" and self.world_size > 1:
            return [f"ddp: {self.world_size} gloo processes on the CPU, "
                    f"{torch.get_num_threads()} thread(s) each"]
        return []

    def local_indices(self, indices: torch.Tensor) -> torch.Tensor:
        start, stop = shard_bounds(len(indices), self.world_size, self.rank)
        return indices[start:stop]

    def loss_scale(self, global_batch_size: int) -> float:
        # DDP averages gradients over ranks: scaling by world_size makes that average the global mean's.
        return self.world_size / global_batch_size

    def gradient_sync(self, last_micro_step: bool):
        return contextlib.nullcontext() if last_micro_step else self.ddp.no_sync()

    def evaluation_net(self) -> nn.Module:
        return self.model

    def optimizer_step(self) -> None:
        super().optimizer_step()
        self._broadcast_buffers()

    def _broadcast_buffers(self) -> None:
        # Each rank updated its BatchNorm statistics (and any buffer its forward writes) from its own
        # shard. DDP copies rank 0's at the start of the next forward only, so after the last step the
        # ranks would differ; copy them now, as the manual strategy does: every rank then holds the
        # same weights and buffers after every step (model.pt, evaluation, the parity check).
        with torch.no_grad():
            for b in self.model.buffers():
                dist.broadcast(b, src=0)

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        return all_sum(t.to(self.devices[0]))  # stays on the device: the caller reads it once

    def eval_mode(self) -> None:
        self._broadcast_buffers()  # after a skipped step too: evaluate everywhere with rank 0's, as model.pt holds
        super().eval_mode()

