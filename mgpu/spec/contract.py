"""The model contract itself: `ModelSpec`, its objective (loss, correct, labels), and batches of
several input tensors. The package docstring (mgpu/spec/__init__.py) says what a spec holds."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

from mgpu.errors import MgpuError, SpecError, one_line

Inputs = Any  # a tensor, or a tuple of tensors: the positional arguments of the model


def cross_entropy_sum(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the examples; outputs (B, C) or (B, ..., C) with targets (B, ...)."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1), reduction="sum")


def argmax_correct(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Examples whose argmax over the last dimension is the target; an example with several
    positions (tokens) counts the fraction of them that are right."""
    hits = (output.detach().argmax(dim=-1) == target).reshape(target.shape[0], -1).float()
    return hits.mean(dim=1).sum()


def select_output(output, field: str | None = None):
    """The tensor of a model's output that the loss scores: the output itself when it is a tensor;
    of a dict (transformers' ModelOutput is one), the entry `field`, else `logits`, else its one
    tensor; of a tuple or list, its one tensor. Anything else is a SpecError naming what there is."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if field is not None:
            if not isinstance(output.get(field), torch.Tensor):
                raise SpecError(f"the model's output ({type(output).__name__}) has no tensor {field!r}: it has "
                                f"{', '.join(map(str, output.keys())) or 'nothing'}")
            return output[field]
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]
        tensors = [k for k, v in output.items() if isinstance(v, torch.Tensor)]
        if len(tensors) == 1:
            return output[tensors[0]]
        raise SpecError(f"the model returns a {type(output).__name__} with {', '.join(map(str, tensors)) or 'no tensors'} "
                        "and no 'logits': name the one the loss scores with ModelSpec(output=...)")
    if isinstance(output, (tuple, list)):
        tensors = [v for v in output if isinstance(v, torch.Tensor)]
        if len(tensors) == 1:
            return tensors[0]
    if field is not None:
        raise SpecError(f"ModelSpec(output={field!r}) names a field, but the model returns a {type(output).__name__}")
    return output  # the spec's own loss may know what to do with it


@dataclass(frozen=True)
class OnOutput:
    """fn(output, target) with the model's output reduced to the tensor the loss scores
    (select_output): a loss or a count of correct examples, as strategies and references call it."""

    fn: Callable[[Any, torch.Tensor], torch.Tensor]
    field: str | None = None

    def __call__(self, output, target: torch.Tensor) -> torch.Tensor:
        return self.fn(select_output(output, self.field), target)


LABELS_LOSSES = ("mean", "sum", "num_items_in_batch")


@dataclass(frozen=True)
class ModelLoss:
    """The loss a model computes itself when given the target (transformers' `labels=`), as the sum
    mgpu needs: `output.loss` times the shard's examples for a mean over them ("mean"); as it is for
    a sum ("sum", and "num_items_in_batch", where the model was given num_items_in_batch=1, so that
    transformers' loss is the sum over the items it counts: tokens, padding left out)."""

    reduction: str = "mean"

    def __call__(self, output, target: torch.Tensor) -> torch.Tensor:
        if isinstance(output, Mapping):
            loss = output.get("loss")
        elif isinstance(output, (tuple, list)) and output:
            loss = output[0]
        else:
            loss = getattr(output, "loss", None)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise SpecError(f"ModelSpec(labels=...) passes the target to the model, which must then return its loss "
                            f"(output.loss, or a tuple's first item): got {type(output).__name__} without one")
        loss = loss.reshape(())
        return loss * target.shape[0] if self.reduction == "mean" else loss


@dataclass(frozen=True)
class Objective:
    """The loss and the count of correct examples a strategy computes on each shard, and how the
    model is called on a shard (`forward`: with the target as a keyword when the model computes its
    own loss)."""

    loss: Callable[[Any, torch.Tensor], torch.Tensor] = cross_entropy_sum
    correct: Callable[[Any, torch.Tensor], torch.Tensor] = argmax_correct
    labels: str | None = None     # the keyword the model takes the target under (None: it is not given the target)
    extra: tuple = ()             # further (keyword, value) pairs of that call

    def forward(self, net, inputs: tuple, target: torch.Tensor):
        """The model's training output for one shard: net(*inputs), or net(*inputs, labels=target, ...)."""
        if self.labels is None:
            return net(*inputs)
        return net(*inputs, **{self.labels: target}, **dict(self.extra))

    def loss_and_stats(self, output, target: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate: the summed loss times `scale`, detached [loss_sum, correct]
        as float32 on the target's device). 1 / global batch size as `scale` gives the mean over
        the global batch whatever the shard sizes are."""
        loss_sum = self.loss(output, target)
        correct = self.correct(output, target).detach()
        return loss_sum * scale, torch.stack([loss_sum.detach().float(), correct.float().to(loss_sum.device)])


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model, draw its batches, and score it (see the module docstring)."""

    build: Callable[[], nn.Module]
    draw: Callable[[int, torch.Generator], tuple[Inputs, torch.Tensor]]
    loss: Callable[[Any, torch.Tensor], torch.Tensor] = cross_entropy_sum
    correct: Callable[[Any, torch.Tensor], torch.Tensor] = argmax_correct
    optimizer: Callable[[list], torch.optim.Optimizer] | None = None
    output: str | None = None  # the field of a dict or ModelOutput output that loss and correct score (default: logits)
    # transformers' convention: the model is given the target as this keyword and returns its own loss
    # (output.loss), which then replaces `loss`; labels_loss says how it reduces (LABELS_LOSSES, ModelLoss).
    labels: str | None = None
    labels_loss: str = "mean"
    name: str = "model"
    source: str | None = None  # "MODULE:FUNCTION" it was loaded from: other processes load it again from there
    options: dict = field(default_factory=dict)  # what load_spec was given besides the source (input shape, classes)

    @property
    def objective(self) -> Objective:
        """loss and correct as strategies call them: on the output's tensor (select_output), or with
        `labels`, the model's own loss as a sum (ModelLoss)."""
        correct = OnOutput(self.correct, self.output)
        if self.labels is None:
            return Objective(OnOutput(self.loss, self.output), correct)
        if self.labels_loss not in LABELS_LOSSES:
            raise SpecError(f"ModelSpec(labels_loss={self.labels_loss!r}): choose one of {', '.join(LABELS_LOSSES)}")
        extra = (("num_items_in_batch", 1),) if self.labels_loss == "num_items_in_batch" else ()
        return Objective(ModelLoss(self.labels_loss), correct, labels=self.labels, extra=extra)

    def build_seeded(self, seed: int) -> nn.Module:
        """build() under `seed`, leaving the caller's random state as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.build()
            if not isinstance(model, nn.Module):
                raise SpecError(f"{self.name}: build() returned {type(model).__name__}, not an nn.Module")
            self._materialize(model, seed)
        return model

    def _materialize(self, model: nn.Module, seed: int) -> None:
        """Lazy modules (nn.LazyLinear, ...) get their shapes, and their initial values under the
        same seed, from one forward of two examples, before anything copies or shards the model."""
        lazy = [name for name, m in model.named_modules() if isinstance(m, nn.modules.lazy.LazyModuleMixin)
                and m.has_uninitialized_params()]
        if not lazy:
            return
        inputs, _ = self.batch(2, seed)
        training = model.training
        try:
            with torch.no_grad():
                model.eval()(*inputs)  # eval: a BatchNorm's running statistics stay as built
        except MgpuError:
            raise
        except Exception as e:
            raise SpecError(f"{self.name}: its lazy modules ({', '.join(n or type(model).__name__ for n in lazy[:4])}) "
                            f"could not be materialised by a forward of 2 examples: {one_line(e, with_type=True)}") from None
        finally:
            model.train(training)

    def batch(self, n: int, seed: int) -> tuple[tuple, torch.Tensor]:
        """draw(n) from a generator seeded with `seed`: (inputs as a tuple, target)."""
        g = torch.Generator().manual_seed(seed)
        try:
            inputs, target = self.draw(n, g)
        except (TypeError, ValueError) as e:
            if "unpack" in str(e):
                raise SpecError(f"{self.name}: draw(n, generator) must return (inputs, target), {e}") from None
            raise
        return as_inputs(inputs), target


# -- batches of several input tensors ------------------------------------------------------------

def as_inputs(inputs: Inputs) -> tuple:
    """The model's positional arguments as a tuple (one tensor becomes a tuple of one)."""
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def batch_length(inputs: Inputs) -> int:
    return as_inputs(inputs)[0].shape[0]


def slice_inputs(inputs: Inputs, start: int, stop: int) -> Inputs:
    """Examples start..stop of every input tensor, in the form given (tensor or tuple)."""
    if isinstance(inputs, torch.Tensor):
        return inputs[start:stop]
    return tuple(t[start:stop] for t in inputs)
