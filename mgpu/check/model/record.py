"""Runs to compare: a strategy's steps as they happen, and the single-device reference.

    plan = RunPlan(batch_size=12, steps=3, seed=0)
    strategy_run = record_strategy(strategy, spec, plan)           # every replica, every step
    reference = reference_run(ReferenceSetup(spec, model, make_optimizer), plan, devices=2, dtype=torch.float64)

A `Recording` holds, for every replica (or DDP rank) of a run: its weights and buffers entering
each step and after the last (`states[step][replica]`, step 0 = the start), its gradients after
step 1's backward, its optimizer state after the last step, and the step's global [loss_sum,
correct]. The strategy is driven through the calls the Trainer makes (`forward_backward`,
`all_sum`, `optimizer_step`), so what is recorded is what training does.

A replica's state after step s is read right after the step: every replica (or rank) of mgpu's
strategies must hold the same weights and buffers then (manual, ddp and fsdp copy the first device's
buffers to the others after each step; torch's DDP alone would do so only at the start of the next
forward, so that after the last step BatchNorm statistics differ between ranks).

The reference (`reference_run`) is plain PyTorch on one device, in float64 or float32, and
computes what data parallelism computes: each device's contiguous shard of the global batch, in
its micro-step pieces, forward and backward one after the other with the buffers each device
starts the step with, the loss summed and scaled by 1 / global batch size, device 0's pieces
last, so that its buffers are the ones kept (what DDP's broadcast and mgpu's manual strategy
keep). For a model whose examples do not interact in the batch this equals one step on the whole
batch (up to rounding); for one with BatchNorm it is the exact single-device equivalent of the
sharded computation.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from mgpu.comm import shard_bounds
from mgpu.check.model.timeout import step_timeout
from mgpu.spec import ModelSpec, slice_inputs

__all__ = ["RunPlan", "Recording", "ReferenceSetup", "Arithmetic", "ReferenceStep", "LocalShard", "assemble_shards", "has_shards", "snapshot",
           "state_digest", "load_snapshot", "record_strategy", "reference_step", "reference_run",
           "check_ties", "device_pieces"]


@dataclass
class Recording:
    states: list[list[dict]] = field(default_factory=list)   # [step 0..k][replica] -> {"weight a.b": t, "buffer c": t}
    grads: list[dict] = field(default_factory=list)          # [replica] -> {param name: grad or None}, after step 1
    optimizer_states: list = field(default_factory=list)     # [step 0..k] -> replica 0's optimizer.state_dict()
    stats: list[list[float]] = field(default_factory=list)   # [step] -> [loss_sum, correct] over the global batch
    ties: list[list[list[str]]] = field(default_factory=list)  # [replica] -> names still sharing one tensor (whole run)
    shards: int = 1  # how many shards the global batch was cut into (a DataParallel pass-through: 1)


@dataclass(frozen=True)
class RunPlan:
    """What a run does: `steps` optimizer steps on global batches of `batch_size` drawn with
    `seed`, each in `micro_steps` pieces per device."""

    batch_size: int
    steps: int
    seed: int
    micro_steps: int = 1

    def batch(self, spec: ModelSpec, step: int) -> tuple[tuple, torch.Tensor]:
        """The global batch of step `step` (1-based; step steps + 1 is the probe after the last)."""
        return spec.batch(self.batch_size, self.seed * 1_000_003 + step)


@dataclass
class LocalShard:
    """A rank's own dim-0 shard of a sharded tensor (FSDP's DTensors), kept as it is rather than
    gathered whole by a collective per tensor: rank 0 puts the ranks' shards together
    (`assemble_shards`) after one gather of the whole recording."""

    local: torch.Tensor
    shape: tuple


def _cpu(t: torch.Tensor, keep_shards: bool = False):
    """A detached CPU copy of a tensor, whole: a sharded one (a DTensor, under fsdp) is gathered
    first, a collective every rank makes at the same point; with keep_shards, a dim-0 shard stays
    this rank's LocalShard."""
    to_local = getattr(t, "to_local", None)
    if callable(to_local):
        from torch.distributed.tensor import Shard

        if keep_shards and tuple(t.placements) == (Shard(0),):
            return LocalShard(to_local().detach().to("cpu", copy=True), tuple(t.shape))
        t = t.full_tensor()
    return t.detach().to("cpu", copy=True)


def snapshot(model: nn.Module, keep_shards: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (persistent or not), detached CPU float copies, by kind and name."""
    state = {f"weight {n}": _cpu(p, keep_shards) for n, p in model.named_parameters()}
    state.update({f"buffer {n}": _cpu(b, keep_shards) for n, b in model.named_buffers()})
    return state


def state_digest(state: dict) -> str:
    """A digest of a snapshot's names, dtypes, shapes and bytes: equal digests, bitwise equal states."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        t = state[name].detach().contiguous()
        h.update(f"{name} {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _grads(model: nn.Module, keep_shards: bool = False) -> dict:
    return {n: None if p.grad is None else _cpu(p.grad, keep_shards) for n, p in model.named_parameters()}


def _cpu_copy(obj, keep_shards: bool = False):
    """A deep copy with every tensor on the CPU (sharded ones gathered whole, or kept as LocalShards)."""
    if isinstance(obj, torch.Tensor):
        return _cpu(obj, keep_shards)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v, keep_shards) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v, keep_shards) for v in obj)
    return copy.deepcopy(obj)


def assemble_shards(per_rank: list) -> list:
    """The same structure as per_rank[0] with every LocalShard replaced by the whole tensor: the
    ranks' shards at that place, concatenated in rank order along dim 0 (FSDP's even chunks, the
    last ones shorter or empty). One whole tensor object serves every rank's place."""
    first = per_rank[0]
    if isinstance(first, LocalShard):
        whole = torch.cat([shard.local for shard in per_rank])
        if tuple(whole.shape) != first.shape:
            raise RuntimeError(f"shards of {tuple(whole.shape)} put together for a tensor of {first.shape}")
        return [whole] * len(per_rank)
    if isinstance(first, dict) and any(has_shards(v) for v in first.values()):
        columns = {k: assemble_shards([d[k] for d in per_rank]) for k in first}
        return [{k: columns[k][r] for k in first} for r in range(len(per_rank))]
    if isinstance(first, (list, tuple)) and any(has_shards(v) for v in first):
        columns = [assemble_shards([x[i] for x in per_rank]) for i in range(len(first))]
        return [type(first)(column[r] for column in columns) for r in range(len(per_rank))]
    return per_rank


def has_shards(obj) -> bool:
    """Whether a recording's piece (a state, a gradient dict, an optimizer state) holds a LocalShard."""
    if isinstance(obj, LocalShard):
        return True
    if isinstance(obj, dict):
        return any(has_shards(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(has_shards(v) for v in obj)
    return False


def load_snapshot(model: nn.Module, state: dict) -> None:
    """Weights and every buffer (non-persistent ones too) from a `snapshot`, cast to the model's dtypes."""
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(state[f"weight {name}"])
        for name, b in list(model.named_buffers()):
            value = state[f"buffer {name}"]
            if b.shape == value.shape:
                b.copy_(value)
            else:  # a buffer the model reassigns with another shape
                owner, _, leaf = name.rpartition(".")
                modules[owner]._buffers[leaf] = value.to(device=b.device, dtype=b.dtype if value.is_floating_point()
                                                         else value.dtype).clone()


def check_ties(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names that are one tensor (tied weights), as the model has them now."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return sorted(names for names in groups.values() if len(names) > 1)


def record_strategy(strategy, spec: ModelSpec, plan: RunPlan, label: str, timeout_s: float | None = None,
                    keep_shards: bool = False, peers: str | None = None) -> Recording:
    """Run `plan` on a set-up strategy (setup done, objective set) and record every replica.

    Under DDP each rank records its own replica; the caller gathers them. `label` names the run
    in timeout messages ("manual on 2 devices"). keep_shards: FSDP's sharded tensors are recorded
    as this rank's LocalShards, for the caller to assemble (no collective per tensor and step).
    peers: the ranks' shared folder of compile times (step_timeout), under --compile.
    """
    modules = strategy.modules()
    rec = Recording(states=[[snapshot(m, keep_shards) for m in modules]],
                    optimizer_states=[_cpu_copy(strategy.optimizers()[0].state_dict(), keep_shards)],
                    shards=len(strategy.devices))  # per process: DDP's ranks are gathered by the caller
    for step in range(1, plan.steps + 1):
        inputs, target = plan.batch(spec, step)
        local = strategy.local_indices(torch.arange(plan.batch_size))
        start, stop = int(local[0]), int(local[-1]) + 1
        with step_timeout(timeout_s, f"{label}: step {step}", peers):
            stats = strategy.all_sum(strategy.forward_backward(slice_inputs(inputs, start, stop), target[start:stop],
                                                              plan.batch_size, plan.micro_steps)).tolist()
            if step == 1:
                rec.grads = [_grads(m, keep_shards) for m in modules]
            rec.stats.append([float(v) for v in stats])
            strategy.optimizer_step()
            strategy.synchronize()
        rec.states.append([snapshot(m, keep_shards) for m in modules])
        rec.optimizer_states.append(_cpu_copy(strategy.optimizers()[0].state_dict(), keep_shards))
    rec.ties = [check_ties(m) for m in modules]
    return rec


def _cast(t, dtype):
    return t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t


def _restore_buffers(model: nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Put back the buffers a device starts the step with (assigned anew: a model may have
    reassigned them in forward)."""
    modules = dict(model.named_modules())
    for name, value in saved.items():
        owner, _, leaf = name.rpartition(".")
        modules[owner]._buffers[leaf] = value.clone()


def device_pieces(batch_size: int, devices: int, micro_steps: int) -> list[list[tuple[int, int]]]:
    """[device][micro-step] -> [start, stop) in the global batch: each device's contiguous shard,
    cut into micro_steps contiguous pieces (as the strategies cut it)."""
    pieces = []
    for d in range(devices):
        start, stop = shard_bounds(batch_size, devices, d)
        cuts = [shard_bounds(stop - start, micro_steps, k) for k in range(micro_steps)]
        pieces.append([(start + a, start + b) for a, b in cuts if b > a])
    return pieces


# template -> {(device, dtype): its copy}: a reference step loads its state into the same copy each
# time, rather than deep-copying a model of many small modules (torchvision's, timm's) for every
# step, which was a large share of a check's time (docs/notes/kernel-timings.md, "Where the time
# went").
_WORKING_COPIES: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _working_copy(template: nn.Module, device, dtype: torch.dtype) -> nn.Module:
    """A copy of `template` cast to (device, dtype), made once and reused (its parameters and
    buffers are loaded anew by each step)."""
    copies = _WORKING_COPIES.setdefault(template, {})
    key = (str(torch.device(device)), dtype)
    if key not in copies:
        copies[key] = copy.deepcopy(template).to(device=device, dtype=dtype)
    return copies[key]


@dataclass
class ReferenceStep:
    grads: dict          # name -> gradient or None
    state: dict          # snapshot after the step
    optimizer_state: dict  # optimizer.state_dict() after the step
    stats: list          # [loss_sum, correct]
    unused: set          # parameters some device's piece did not use


@dataclass(frozen=True)
class ReferenceSetup:
    """What every reference step of a check shares: the spec, the model as built (its structure,
    which the steps never change), the optimizer's factory, and how long a step may take."""

    spec: ModelSpec
    template: nn.Module
    make_optimizer: Callable
    timeout_s: float | None = None


@dataclass(frozen=True)
class Arithmetic:
    """How a reference step computes: its dtype, where it runs (its results come back on the CPU; a
    float32 step on the GPU the checked run used has that GPU's rounding, which a CPU's float32 does
    not), and the autocast dtype of the forward and loss (check --amp bf16), as the strategies run them."""

    dtype: torch.dtype
    device: str | torch.device = "cpu"
    autocast: torch.dtype | None = None


def reference_step(setup: ReferenceSetup, state: dict, optimizer_state: dict, plan: RunPlan, step: int, devices: int,
                   arithmetic: Arithmetic) -> ReferenceStep:
    """One step of single-device plain PyTorch, computing what `devices` devices compute (see the
    module docstring), from `state` (a snapshot) and `optimizer_state` (an optimizer's state_dict)."""
    spec, template, make_optimizer = setup.spec, setup.template, setup.make_optimizer
    dtype, device, autocast = arithmetic.dtype, arithmetic.device, arithmetic.autocast
    label = f"the single-device reference ({dtype}, {devices} shards)"
    model = _working_copy(template, device, dtype)
    load_snapshot(model, state)
    for p in model.parameters():
        p.grad = None  # a step cut short (a timeout) may have left some
    params = list(model.parameters())
    named = [n for n, _ in model.named_parameters()]
    optimizer = make_optimizer(params)
    if optimizer_state.get("state"):
        optimizer.load_state_dict(copy.deepcopy(optimizer_state))  # casts floating state to the parameters' dtype
    pieces = device_pieces(plan.batch_size, devices, plan.micro_steps)
    inputs, target = plan.batch(spec, step)
    inputs = tuple(_cast(t, dtype).to(device) if isinstance(t, torch.Tensor) else t for t in inputs)
    target = target.to(device)
    start_buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    objective = spec.objective
    unused = set()
    loss_sum = correct = 0.0
    with step_timeout(setup.timeout_s, f"{label}: step {step}"):
        for d in reversed(range(devices)):  # device 0 last: its buffers are the ones every replica keeps
            _restore_buffers(model, start_buffers)
            for start, stop in pieces[d]:
                y = target[start:stop]
                with (torch.autocast(device_type=torch.device(device).type, dtype=autocast) if autocast
                      else contextlib.nullcontext()):
                    output = objective.forward(model, slice_inputs(inputs, start, stop), y)
                    loss = objective.loss(output, y)
                grads = torch.autograd.grad(loss * (1.0 / plan.batch_size), params, allow_unused=True)
                for name, p, g in zip(named, params, grads):
                    if g is None:
                        unused.add(name)
                        continue
                    p.grad = g.detach().clone() if p.grad is None else p.grad + g.detach()
                loss_sum += float(loss.detach())
                correct += float(objective.correct(output, y))
    grads = _grads(model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return ReferenceStep(grads, snapshot(model), _cpu_copy(optimizer.state_dict()),
                         [loss_sum, correct], unused)


def reference_run(setup: ReferenceSetup, plan: RunPlan, devices: int, dtype: torch.dtype) -> Recording:
    """`plan.steps` reference steps on the CPU, each from the last one's result (a free-running run)."""
    model = setup.template
    state = snapshot(model)
    optimizer_state = _cpu_copy(setup.make_optimizer(list(copy.deepcopy(model).parameters())).state_dict())
    rec = Recording(states=[[state]], optimizer_states=[optimizer_state])
    for step in range(1, plan.steps + 1):
        result = reference_step(setup, state, optimizer_state, plan, step, devices, Arithmetic(dtype))
        state, optimizer_state = result.state, result.optimizer_state
        if step == 1:
            rec.grads = [result.grads]
        rec.states.append([state])
        rec.optimizer_states.append(optimizer_state)
        rec.stats.append(result.stats)
    rec.ties = [check_ties(model)]
    return rec
