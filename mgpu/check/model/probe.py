"""What a model does that data parallelism must know about, found by running it.

Each probe runs copies of the model on the CPU in training mode; none changes the model given.

* `find_random_layers`: the forward run twice on the same input and state gives different outputs.
  `nn.Dropout` and its family, attention dropout, and dropout that forward applies by calling
  torch's functions itself (`F.dropout`, `scaled_dot_product_attention(dropout_p=...)`, as
  transformers and timm do) can be switched off for the checks (`switch_off_dropout`,
  mgpu/check/dropout.py); anything random that is left is other randomness.
* `find_mixing_layers`: modules whose output for an example depends on the other examples of the
  batch (BatchNorm, or a home-made layer that subtracts the batch mean): run on the whole batch and
  on its shards, in float64, and compared.
* `find_buffer_updates`: buffers a training forward writes (BatchNorm's running statistics), and
  those it *reassigns* (`self.buf = ...`).
* `loss_is_a_sum`: loss(all) = loss(part) + loss(rest); a mean makes each shard's examples weigh
  differently from the whole batch's.

`probe_model` runs them all on the model a check copies into every run, leaves its dropout off,
and returns the `Traits` the check judges with.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from mgpu.check.model.compare import error
from mgpu.check.dropout import DropoutOff, hold_dropout_off
from mgpu.check.model.record import RunPlan, check_ties
from mgpu.spec import ModelSpec, select_output, slice_inputs

__all__ = ["flatten_output", "switch_off_dropout", "find_random_layers", "find_mixing_layers",
           "find_buffer_updates", "loss_is_a_sum", "MIXING_REL_TOL", "Traits", "probe_model"]

# Float64 outputs of the whole batch and of its shards differing by more than this (relative to the
# output's magnitude) mean the examples interact; float64 rounding of the same arithmetic is ~1e-15.
MIXING_REL_TOL = 1e-9


def flatten_output(output) -> list[torch.Tensor]:
    """The tensors in a model's output (a tensor, or tuples, lists and dicts of them), in order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in flatten_output(v)]
    if isinstance(output, (tuple, list)):
        return [t for v in output for t in flatten_output(v)]
    return []


def _same(a, b) -> bool:
    fa, fb = flatten_output(a), flatten_output(b)
    return len(fa) == len(fb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(fa, fb))


def _dropout_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    found = []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            found.append((name, m))
        elif isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
            found.append((name, m))
    return found


def switch_off_dropout(model: nn.Module, calls: bool = False) -> list[str]:
    """Dropout layers (nn.Dropout family, attention dropout) made the identity, in place; their names.

    A Dropout module is put in eval mode, which mgpu's parity runs never undo; attention's dropout
    probability is set to 0. calls=True: the dropout that the model's forward applies by calling
    torch's functions itself (F.dropout, scaled_dot_product_attention's dropout_p) is held off
    too, in every forward of the model and of its copies (mgpu.check.dropout).
    """
    names = []
    for name, m in _dropout_modules(model):
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
        else:
            m.eval()
        names.append(name or type(m).__name__)
    if calls:
        hold_dropout_off(model, DropoutOff())
    return names


def find_random_layers(spec: ModelSpec, model: nn.Module, inputs: tuple) -> tuple[list[str], dict, bool]:
    """(dropout modules found, the dropout calls its forward makes outside them {call: count in one
    forward}, whether the forward is random even with all of those off).

    Every run starts from the same state (copies of `model`), on the same input, so a difference
    can only come from random numbers drawn in forward. Every module's output is compared, not only
    the model's: a head initialised to zeros (torchvision's ViT) gives the same output whatever
    dropout did below it, while the gradients still differ.
    """
    def run(m):
        m = copy.deepcopy(m)
        outputs = []
        # Cloned as each module returns: an in-place layer after it (ReLU(inplace=True)) would change them.
        keep = lambda out: outputs.extend(t.clone() for t in flatten_output(out))  # noqa: E731
        hooks = [module.register_forward_hook(lambda module, args, out: keep(out)) for module in m.modules()]
        try:
            with torch.no_grad():
                keep(m(*inputs))
        finally:
            for hook in hooks:
                hook.remove()
        return outputs

    model = copy.deepcopy(model).train()
    if _same(run(model), run(model)):
        return [], {}, False
    modules = switch_off_dropout(model)
    counted = DropoutOff()
    with counted:
        first = run(model)
    with DropoutOff():
        second = run(model)
    return modules, dict(counted.calls), not _same(first, second)


def _cut(value, batch: int, start: int, stop: int):
    return value[start:stop] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == batch else value


def _clone(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _mixes(module: nn.Module, args: tuple, kwargs: dict, output, batch: int, shards) -> bool | None:
    """Whether `module`'s output on the whole batch differs from the concatenation of its outputs
    on the shards ([start, stop) each; keyword arguments, such as an attention mask, passed along);
    None when that cannot be told (outputs not batch-first, or it fails on shards)."""
    outs = flatten_output(output)
    if not outs or any(o.dim() == 0 or o.shape[0] != batch or not o.is_floating_point() for o in outs):
        return None
    try:
        parts = []
        with torch.no_grad():
            for start, stop in shards:
                shard_args = tuple(_cut(a, batch, start, stop) for a in args)
                shard_kwargs = {k: _cut(v, batch, start, stop) for k, v in kwargs.items()}
                parts.append(flatten_output(copy.deepcopy(module)(*shard_args, **shard_kwargs)))
    except Exception:
        return None
    if any(len(p) != len(outs) for p in parts):
        return None
    return any(error(torch.cat([p[j] for p in parts]), outs[j])[1] > MIXING_REL_TOL for j in range(len(outs)))


def find_mixing_layers(model: nn.Module, inputs: tuple, shards) -> tuple[bool, list[str]]:
    """(whether the model's output mixes the examples of a batch, the innermost modules that do).

    In float64 and training mode, on copies; a module is named when it mixes and none of its
    submodules does (so a BatchNorm is named, not every block around it). Each module's inputs
    are copied before it runs and its output right after, so in-place layers later in the model
    (ReLU(inplace=True), Hardswish) cannot change what is compared.
    """
    model = copy.deepcopy(model).double().train()
    switch_off_dropout(model)  # train() switched them back on
    batch = inputs[0].shape[0]
    inputs = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    if any(stop <= start for start, stop in shards):  # a shard without examples: nothing to compare
        return False, []
    work = copy.deepcopy(model)
    seen: dict[str, tuple] = {}
    pending: dict[str, tuple] = {}
    for name, m in work.named_modules():
        def before(module, args, kwargs, name=name):
            if name not in seen and name not in pending:  # a module called twice is judged on its first call
                pending[name] = (copy.deepcopy(module), tuple(_clone(a) for a in args),
                                 {k: _clone(v) for k, v in kwargs.items()})

        def after(module, args, kwargs, output, name=name):
            if name in pending:
                module_copy, a, k = pending.pop(name)
                seen[name] = (module_copy, a, k, [_clone(o) for o in flatten_output(output)])

        m.register_forward_pre_hook(before, with_kwargs=True)
        m.register_forward_hook(after, with_kwargs=True)
    with torch.no_grad():
        whole = work(*inputs)
    mixes_overall = _mixes(model, inputs, {}, whole, batch, shards)
    mixing = {name for name, (module, args, kwargs, output) in seen.items()
              if name and _mixes(module, args, kwargs, output, batch, shards)}
    innermost = [name for name in mixing if not any(o != name and o.startswith(name + ".") for o in mixing)]
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return bool(mixes_overall) or bool(innermost), sorted(innermost, key=lambda name: order.get(name, 0))


def find_buffer_updates(model: nn.Module, inputs: tuple) -> tuple[list[str], list[str]]:
    """(buffers a training forward changes, buffers it reassigns to a new tensor)."""
    model = copy.deepcopy(model).train()
    switch_off_dropout(model)
    before = {n: (b, b.detach().clone()) for n, b in model.named_buffers()}
    with torch.no_grad():
        model(*inputs)
    after = dict(model.named_buffers())
    changed, reassigned = [], []
    for name, (obj, value) in before.items():
        now = after.get(name)
        if now is None:
            continue
        if now is not obj:
            reassigned.append(name)
        if now.shape != value.shape or not torch.equal(now, value):
            changed.append(name)
    return changed, reassigned


def loss_is_a_sum(spec: ModelSpec, model: nn.Module, inputs: tuple, target: torch.Tensor) -> str | None:
    """None when loss(all) = loss(first example) + loss(the rest), in float64; else what was seen."""
    if target.shape[0] < 2:
        return None
    model = copy.deepcopy(model).double().eval()  # eval: a BatchNorm must not make the parts differ
    inputs = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    objective = spec.objective
    rel_tol = 1e-9
    if objective.labels is not None:  # the model computes its loss itself: one forward per part
        losses = []
        with torch.no_grad():
            for a, b in ((0, len(target)), (0, 1), (1, len(target))):
                losses.append(objective.loss(objective.forward(model, slice_inputs(inputs, a, b), target[a:b]), target[a:b]))
        whole, parts = float(losses[0]), float(losses[1]) + float(losses[2])
        if losses[0].dtype != torch.float64:
            # transformers computes its losses in float32 whatever the model's dtype: a sum is then
            # equal up to float32 rounding, and a mean per shard still misses by far more.
            rel_tol = 1e-5
    else:
        with torch.no_grad():
            output = select_output(model(*inputs), spec.output)
        if not isinstance(output, torch.Tensor) or output.shape[:1] != target.shape[:1]:
            return None
        with torch.no_grad():
            whole = float(spec.loss(output, target))
            parts = float(spec.loss(output[:1], target[:1])) + float(spec.loss(output[1:], target[1:]))
    if math.isclose(whole, parts, rel_tol=rel_tol, abs_tol=1e-12):
        return None
    return (f"the loss is not a sum over examples: loss of {target.shape[0]} examples {whole:.6g}, loss of 1 plus "
            f"loss of the other {target.shape[0] - 1} {parts:.6g} (a mean per device weighs a smaller shard's "
            "examples more): " + (
                f"the model's own loss times the examples (labels_loss={spec.labels_loss!r}) is not one: a mean over "
                "tokens, padding left out, needs labels_loss='num_items_in_batch' (transformers' models take it)"
                if objective.labels is not None else
                "return the sum (reduction='sum'); mgpu divides by the global batch size"))


@dataclass
class Traits:
    """What the probes found in a model; the check adds `unused` from the reference steps."""

    dropout: list[str]             # nn.Dropout-family modules
    dropout_calls: dict            # dropout the forward applies through torch's functions: {call: count per forward}
    other_randomness: bool
    mixing: bool
    mixing_layers: list[str]
    changed_buffers: list[str]
    reassigned_buffers: list[str]
    mean_loss: str | None
    ties: list[list[str]]
    unused: list[str] = field(default_factory=list)


def probe_model(spec: ModelSpec, model: nn.Module, plan: RunPlan, shards) -> Traits:
    """Every probe on step 1's batch of `plan` (mixing: over `shards`, [start, stop) each, as the plan
    cuts the batch on the most devices); `model`'s dropout is left off."""
    inputs, target = plan.batch(spec, 1)
    dropout, calls, other = find_random_layers(spec, model, inputs)
    switch_off_dropout(model, calls=bool(calls))  # the model every run copies: held off in all of them
    with DropoutOff():  # the probes below also run the model's modules on their own, outside its forward
        mixing, layers = (False, []) if other else find_mixing_layers(model, inputs, shards=shards)
        changed, reassigned = find_buffer_updates(model, inputs)
        mean_loss = loss_is_a_sum(spec, model, inputs, target)
    return Traits(dropout, calls, other, mixing, layers, changed, reassigned, mean_loss, check_ties(model))
