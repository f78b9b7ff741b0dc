"""The model contract: what mgpu needs to know to train, check or time any PyTorch model.

    python -m mgpu check examples/tiny_lm.py:spec                                 # a ModelSpec
    python -m mgpu check torchvision.models:resnet18 --input-shape 3,32,32 --classes 10   # a module

A user points mgpu at `MODULE:FUNCTION` (a module name, or a path to a .py file). The function
returns either a `ModelSpec`, or an `nn.Module` that takes images (then the input shape and the
class count say what synthetic batches look like). A spec holds:

* `build()`: a new model. mgpu calls it under a seed it chooses, on the CPU.
* `draw(n, generator)`: a batch of n examples, `(inputs, target)`: `inputs` one tensor or a tuple
  of tensors (the model is called as `model(*inputs)`), each with the examples along dim 0, as
  is `target`. Everything random comes from `generator`, so the same seed gives the same batch.
* `loss(output, target)`: the loss *summed* over the examples (default: cross-entropy). A sum,
  not a mean, so that shards of any size add up to the global batch's loss; mgpu scales it by
  1 / global batch size itself.
* `correct(output, target)`: how many examples are right, summed (default: argmax over the last
  dimension equals the target, averaged over any other non-batch dimensions of an example).
* `optimizer(params)`: optional; default, the suite's SGD.

mgpu's own networks are two such specs (`builtin_spec("resnet18")`, `builtin_spec("lenet")`).
Everything a user can get wrong here is a `SpecError` naming the problem (one line from the CLI).
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.util
import math
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from mgpu.errors import MgpuError, SpecError, one_line

__all__ = ["ModelSpec", "Objective", "ModelLoss", "LABELS_LOSSES", "select_output", "OnOutput", "ImageBatches", "image_spec", "builtin_spec", "load_spec", "parse_input_shape",
           "as_inputs", "batch_length", "slice_inputs", "cross_entropy_sum", "argmax_correct", "validate_spec"]

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


# -- specs for images --------------------------------------------------------------------------------

def parse_input_shape(text: str | Sequence[int]) -> tuple[int, int, int]:
    """'C,H,W' (or a sequence of three ints) as a tuple of three positive integers."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    try:
        shape = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 3 or any(s < 1 for s in shape) or (isinstance(text, str) and not all(p.strip().isdigit() for p in parts)):
        raise SpecError(f"input shape must be C,H,W: three positive integers such as 3,32,32, got {text!r}")
    return shape


@dataclass(frozen=True)
class ImageBatches:
    """draw(n, generator) for image classifiers: uniform [0, 1) images and uniform labels."""

    input_shape: tuple[int, int, int]
    classes: int

    def __call__(self, n: int, g: torch.Generator):
        return torch.rand((n, *self.input_shape), generator=g), torch.randint(0, self.classes, (n,), generator=g)


def image_spec(build: Callable[[], nn.Module], input_shape: Sequence[int], classes: int, name: str = "model",
               **kwargs) -> ModelSpec:
    """A spec for a classifier of images: batches of uniform [0, 1) images of `input_shape`
    (C, H, W) with labels 0..classes-1, cross-entropy."""
    shape = parse_input_shape(input_shape)
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
        raise SpecError(f"classes must be a positive integer, got {classes!r}")
    return ModelSpec(build=build, draw=ImageBatches(shape, classes), name=name,
                     options={"input_shape": ",".join(map(str, shape)), "classes": classes}, **kwargs)


def builtin_spec(name: str, width: int = 64, num_classes: int = 10) -> ModelSpec:
    """mgpu's own networks as specs: `resnet18` (at `width`) and `lenet`, on 1x28x28 images."""
    from mgpu.models import MODEL_NAMES, build_model

    if name not in MODEL_NAMES:
        raise SpecError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}, or give MODULE:FUNCTION")
    return image_spec(functools.partial(build_model, name, width=width, num_classes=num_classes), (1, 28, 28),
                      num_classes, name=name if name != "resnet18" else f"resnet18 (width {width})")


# -- MODULE:FUNCTION --------------------------------------------------------------------------------

def _import(module_part: str):
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        path = Path(module_part)
        if not path.is_file():
            raise SpecError(f"cannot import {module_part}: no such file")
        name = "mgpu_user_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
        if name in sys.modules:
            return sys.modules[name]
        if str(path.resolve().parent) not in sys.path:
            sys.path.insert(0, str(path.resolve().parent))  # so that the file's own imports of its neighbours work
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise SpecError(f"cannot import {module_part}: not a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except BaseException as e:
            del sys.modules[name]
            if isinstance(e, (KeyboardInterrupt, SystemExit)) and not isinstance(e, SystemExit):
                raise
            raise SpecError(f"cannot import {module_part}: {one_line(e, with_type=True)}") from None
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `mgpu check mymodels:net` finds ./mymodels.py, as `python -m` would
    try:
        return importlib.import_module(module_part)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise SpecError(f"cannot import {module_part}: {one_line(e, with_type=True)}") from None


def load_spec(target: str, input_shape: str | Sequence[int] | None = None, classes: int | None = None) -> ModelSpec:
    """The ModelSpec behind `MODULE:FUNCTION`: the function's ModelSpec, or an image spec around
    the nn.Module it returns (`input_shape` C,H,W needed; `classes` read off the output if not
    given). Every problem is a SpecError naming it."""
    if not isinstance(target, str) or ":" not in target or target.startswith(":") or target.endswith(":"):
        raise SpecError(f"model must be MODULE:FUNCTION (a module name or a .py file, then the function), got {target!r}")
    module_part, function_name = target.rsplit(":", 1)
    module = _import(module_part)
    fn = getattr(module, function_name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:12]
        raise SpecError(f"{module_part} has no function {function_name!r}"
                        + (f" (it has: {', '.join(public)})" if public else ""))
    if not callable(fn):
        raise SpecError(f"{target} is a {type(fn).__name__}, not a function")
    result = _call(fn, target)
    options = {}
    if input_shape is not None:
        options["input_shape"] = ",".join(map(str, parse_input_shape(input_shape)))
    if classes is not None:
        if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
            raise SpecError(f"classes must be a positive integer, got {classes!r}")
        options["classes"] = classes
    if isinstance(result, ModelSpec):
        if options:
            raise SpecError(f"{target} returns a ModelSpec, which says how to draw its batches itself: "
                            "leave out --input-shape and --classes")
        return replace(result, source=target, options={}, name=result.name if result.name != "model" else target)
    if isinstance(result, nn.Module):
        if input_shape is None:
            raise SpecError(f"{target} returns an nn.Module ({type(result).__name__}): give the shape of one input "
                            "image with --input-shape C,H,W (and --classes N), or return an mgpu.ModelSpec")
        shape = parse_input_shape(input_shape)
        if classes is None:
            classes = _classes_of(result, shape, target)
            options["classes"] = classes
        first = [result]

        def build() -> nn.Module:
            # The object already built serves the first call; later calls build anew under the caller's seed.
            return first.pop() if first else _call(fn, target)

        spec = image_spec(build, shape, classes, name=target, source=target)
        return replace(spec, options=options)
    raise SpecError(f"{target} returned {type(result).__name__}: it must return an nn.Module or an mgpu.ModelSpec")


def _call(fn, target: str):
    try:
        return fn()
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        raise SpecError(f"{target} raised {one_line(e, with_type=True)}") from None


def _classes_of(model: nn.Module, shape: tuple[int, int, int], target: str) -> int:
    out = _forward_check(copy.deepcopy(model).eval(), (torch.zeros(2, *shape),), f"{target} on 2x{'x'.join(map(str, shape))} images")
    try:
        out = select_output(out)
    except SpecError:
        pass  # named below, as any output that is not (batch, classes) scores
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        raise SpecError(f"{target} gives {_describe(out)} for 2 images of {'x'.join(map(str, shape))}: "
                        "an image classifier must give (batch, classes) scores")
    return int(out.shape[1])


def _describe(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    return f"a {type(out).__name__}"


def _forward_check(model: nn.Module, inputs: tuple, what: str):
    try:
        with torch.no_grad():
            return model(*inputs)
    except Exception as e:
        shapes = ", ".join(str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs)
        raise SpecError(f"inputs of shape {shapes} do not fit the model ({what}): {one_line(e, with_type=True)}") from None


def validate_spec(spec: ModelSpec, batch_size: int = 4, seed: int = 0) -> None:
    """SpecError when the spec cannot be trained as data-parallel training needs: no parameters,
    a draw that does not give `batch_size` examples, inputs that do not fit the model, an output
    that does not fit the loss, a loss that is not a number, or a mean where a sum is needed."""
    model = spec.build_seeded(seed)
    if not any(p.requires_grad for p in model.parameters()):
        raise SpecError(f"{spec.name} has no parameters to train")
    inputs, target = spec.batch(batch_size, seed)
    for i, t in enumerate((*inputs, target)):
        what = "target" if i == len(inputs) else f"input {i}"
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{spec.name}: draw() gave {type(t).__name__} as {what}: every input and the target must be tensors")
        if t.dim() == 0 or t.shape[0] != batch_size:
            raise SpecError(f"{spec.name}: draw({batch_size}) gave {what} of shape {tuple(t.shape)}: "
                            f"dim 0 must hold the {batch_size} examples")
    model.train()
    objective = spec.objective
    try:
        output = objective.forward(model, inputs, target)
    except MgpuError:
        raise
    except Exception as e:
        shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
        raise SpecError(f"{spec.name}: inputs of shape {shapes} do not fit the model: {one_line(e, with_type=True)}") from None
    try:
        loss = objective.loss(output, target)
    except SpecError:
        raise
    except Exception as e:
        raise SpecError(f"{spec.name}: the model's output ({_describe(output)}) does not fit the loss with targets of "
                        f"shape {tuple(target.shape)}: {one_line(e, with_type=True)}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        raise SpecError(f"{spec.name}: the loss must be one floating-point number, got {_describe(loss)}")
    if not math.isfinite(float(loss.detach())):
        raise SpecError(f"{spec.name}: the loss of a freshly built model is {float(loss.detach())}")
    try:
        correct = objective.correct(output, target)
        float(correct)
    except Exception as e:
        raise SpecError(f"{spec.name}: cannot count correct examples from the output ({_describe(output)}) and "
                        f"targets of shape {tuple(target.shape)}: {one_line(e, with_type=True)}") from None
    if not 0 <= float(correct) <= batch_size:
        raise SpecError(f"{spec.name}: correct() gave {float(correct)} for {batch_size} examples: it must count "
                        "examples (0..batch size)")
    try:
        loss.backward()
    except Exception as e:
        raise SpecError(f"{spec.name}: backward through the loss failed: {one_line(e, with_type=True)}") from None
