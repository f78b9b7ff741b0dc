"""Fully sharded data parallelism (FSDP2, `torch.distributed.fsdp.fully_shard`): DDP's processes,
with each rank holding 1/N of the weights, gradients and optimizer state.

    python -m mgpu train --strategy fsdp --devices 2                        # mgpu starts the ranks
    torchrun --nproc-per-node 2 -m mgpu train --strategy fsdp              # torchrun starts them
    python -m mgpu train --strategy fsdp --devices 2 --shard model --reshard-after-forward off

Everything DDP does around the step is inherited: one process per device (gloo on CPUs, nccl on
GPUs), each rank's contiguous part of every global batch, the loss scaled by world_size / global
batch size (FSDP's reduce-scatter averages over ranks, as DDP's allreduce does), the step's one
host read, buffers copied from rank 0 after every step. What differs:

* `wrap` first copies rank 0's weights and buffers to every rank (FSDP2, unlike DDP, does not:
  ranks that built the model from different seeds would otherwise train different models), then
  shards: `fully_shard` on each block (`--shard block`: the non-container children, descending
  into Sequential / ModuleList, so each residual block of ResNet-18 and each layer of LeNet; a
  block whose parameters are tied to another's stays with the root, so that the tie survives),
  then on the root. `--shard model`: the root only. The optimizer is built on the sharded
  parameters (DTensors), so its state is sharded too.
* Gradient accumulation: `set_requires_gradient_sync(False)` for every micro-step but the last.
* Evaluation: the parameters are gathered once (`unshard`, no resharding after forward) and every
  rank predicts its shard of each test batch without collectives, so a rank whose shard of the
  last batch is empty skips it, as under DDP; training reshards them.
* State: `model_state_dict` and `optimizer_state_dict` are the full, unsharded state gathered by
  torch's distributed-checkpoint helpers (`get_model_state_dict`, `get_optimizer_state_dict`), on
  rank 0 (the others get an empty dict); every rank must call them. The optimizer state is keyed
  by parameter index, as `torch.optim.Optimizer.state_dict()` is, so checkpoints and `model.pt`
  are interchangeable with every other strategy's.
* `--amp bf16`: FSDP's MixedPrecisionPolicy (parameters gathered and computed in bfloat16,
  gradients reduced in float32, outputs cast to float32) instead of autocast.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from mgpu.config import StrategySettings
from mgpu.errors import ConfigError, SpecError
from mgpu.strategies.ddp import DistributedDataParallel

# fully_shard became public API (torch.distributed.fsdp.fully_shard) in torch 2.6.
FSDP_MIN_TORCH = "2.6"


def fully_shard_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def check_fsdp_supported() -> None:
    """ConfigError naming the torch version needed when this torch has no public `fully_shard`."""
    if not fully_shard_available():
        raise ConfigError(f"the fsdp strategy needs torch >= {FSDP_MIN_TORCH} (torch.distributed.fsdp.fully_shard); "
                          f"this is torch {torch.__version__}")


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules `--shard block` gives a `fully_shard` each, in order.

    The children of the model that are not containers (Sequential, ModuleList and ModuleDict are
    descended into) and have parameters. A unit sharing a parameter with another unit, or with a
    layer outside every unit, is left to the root: FSDP would otherwise shard the one tensor
    twice, and the tied weights would come apart.
    """
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, containers):
                visit(child)
            elif any(True for _ in child.parameters()):
                units.append(child)

    visit(model)
    unit_of: dict[int, int] = {}
    split: set[int] = set()
    for i, unit in enumerate(units):
        for m in unit.modules():
            if id(m) in unit_of and unit_of[id(m)] != i:  # one module inside two units
                split |= {i, unit_of[id(m)]}
            unit_of[id(m)] = i
    holders: dict[int, set] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                holders.setdefault(id(p), set()).add(unit_of.get(id(m), "root"))
    for groups in holders.values():
        if len(groups) > 1:
            split |= {g for g in groups if g != "root"}
    return [unit for i, unit in enumerate(units) if i not in split]


def _by_index(state: dict) -> dict:
    """get_optimizer_state_dict's result (parameters named) keyed as Optimizer.state_dict() is:
    parameters numbered in the order of the param groups."""
    if not state:
        return {}
    index = {}
    groups = []
    for group in state["param_groups"]:
        ids = []
        for name in group["params"]:
            index.setdefault(name, len(index))
            ids.append(index[name])
        groups.append({**group, "params": ids})
    return {"state": {index[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def _by_name(state: dict, names: list[list[str]]) -> dict:
    """The inverse of `_by_index`, with `names[g]` the parameter names of param group g."""
    flat = [name for group in names for name in group]
    groups = []
    for group, group_names in zip(state["param_groups"], names):
        groups.append({**group, "params": list(group_names)})
    return {"state": {flat[i]: value for i, value in state["state"].items()}, "param_groups": groups}


class FullyShardedDataParallel(DistributedDataParallel):
    """DDP's ranks, sharded per `settings.shard`, gathered weights freed after forward per
    `settings.reshard_after_forward`."""

    name = "fsdp"
    mp_policy = None  # --amp bf16: FSDP's MixedPrecisionPolicy, from use_speed_options (None: fp32 throughout)

    @classmethod
    def preflight(cls, devices: int, settings: StrategySettings) -> None:
        check_fsdp_supported()
        super().preflight(devices, settings)

    @classmethod
    def create(cls, devices: int, settings: StrategySettings = StrategySettings()) -> "FullyShardedDataParallel":
        check_fsdp_supported()
        return super().create(devices, settings)

    def use_speed_options(self, amp: str = "off", channels_last: bool = False, compile: bool = False) -> None:
        super().use_speed_options(amp, channels_last, compile)
        if self.autocast_dtype is not None:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            # bf16 weights in forward and backward, gradients reduced (and kept) in fp32.
            self.mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                  output_dtype=torch.float32)
            self.autocast_dtype = None

    def setup(self, model: nn.Module, make_optimizer) -> None:
        if self.settings.sync_bn:
            raise ConfigError("--sync-bn is not supported with the fsdp strategy (it converts BatchNorm for ddp only)")
        super().setup(model, make_optimizer)
        self.fsdp = self.wrapped

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if not any(True for _ in model.parameters()):
            raise SpecError("the model has no parameters to shard: fsdp needs at least one")
        device = self.devices[0]
        with torch.no_grad():  # every rank starts from rank 0's weights and buffers
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        mesh = init_device_mesh(device.type, (self.world_size,))
        policy = self.mp_policy or MixedPrecisionPolicy()
        reshard = self.settings.reshard_after_forward
        if self.settings.shard == "block":
            for unit in shard_units(model):
                fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        return model

    def gradient_sync(self, last_micro_step: bool):
        self.fsdp.set_requires_gradient_sync(last_micro_step)
        return contextlib.nullcontext()

    def _fsdp_modules(self) -> list[nn.Module]:
        from torch.distributed.fsdp import FSDPModule

        return [m for m in self.model.modules() if isinstance(m, FSDPModule)]

    def eval_mode(self) -> None:
        super().eval_mode()
        # Gathered once for the whole evaluation: a forward then starts no collective, so ranks may
        # hold different numbers of non-empty shards (see Strategy.count_correct).
        self.fsdp.set_reshard_after_forward(False)
        for m in self._fsdp_modules():
            m.unshard()

    def train_mode(self) -> None:
        super().train_mode()
        if not hasattr(self, "fsdp"):
            return
        for m in self._fsdp_modules():
            m.reshard()
            if m is not self.fsdp:  # the root keeps its parameters after forward (FSDP's own choice)
                m.set_reshard_after_forward(self.settings.reshard_after_forward, recurse=False)

    def evaluation_net(self) -> nn.Module:
        return self.model

    def notes(self) -> list[str]:
        if self.devices[0].type == "cpu" and self.world_size > 1:
            return [f"fsdp: {self.world_size} gloo processes on the CPU, {torch.get_num_threads()} thread(s) each, "
                    f"sharded per {self.settings.shard}"]
        return []

    # -- state: full and unsharded, through torch's distributed-checkpoint helpers ------------------
    def _options(self, **kw):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, **kw)

    def model_state_dict(self) -> dict:
        """The full state_dict on rank 0 (CPU tensors); an empty dict on the other ranks. A collective."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model, options=self._options(cpu_offload=True))

    def optimizer_state_dict(self) -> dict:
        """Optimizer.state_dict()'s layout, full, on rank 0; an empty dict elsewhere. A collective."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return _by_index(get_optimizer_state_dict(self.model, self.optimizer, options=self._options(cpu_offload=True)))

    def load_state_dicts(self, model_state: dict, optimizer_state: dict | None = None) -> None:
        """Every rank passes the full state (as read from a checkpoint) and keeps its shard."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        set_model_state_dict(self.model, model_state, options=self._options())
        if optimizer_state is not None and not any(isinstance(v, torch.Tensor) for state in
                                                   optimizer_state.get("state", {}).values() for v in state.values()):
            # No tensor to shard (plain SGD: momentum_buffer None), and torch's helper needs one to
            # find the device: the state loads as it is.
            self.optimizer.load_state_dict(optimizer_state)
        elif optimizer_state is not None:
            ids = {id(p): n for n, p in self.model.named_parameters()}
            names = [[ids[id(p)] for p in group["params"]] for group in self.optimizer.param_groups]
            set_optimizer_state_dict(self.model, self.optimizer, _by_name(optimizer_state, names),
                                     options=self._options())
