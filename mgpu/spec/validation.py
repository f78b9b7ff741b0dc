"""`validate_spec`: a spec's build, draw, loss and correct tried once on a small batch, each failure a
`SpecError` that names the part and what it got."""

from __future__ import annotations

import math

import torch
from torch import nn

from mgpu.errors import MgpuError, SpecError, one_line
from mgpu.spec.contract import ModelSpec


def describe_output(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    return f"a {type(out).__name__}"


def forward_check(model: nn.Module, inputs: tuple, what: str):
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
        raise SpecError(f"{spec.name}: the model's output ({describe_output(output)}) does not fit the loss with targets of "
                        f"shape {tuple(target.shape)}: {one_line(e, with_type=True)}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        raise SpecError(f"{spec.name}: the loss must be one floating-point number, got {describe_output(loss)}")
    if not math.isfinite(float(loss.detach())):
        raise SpecError(f"{spec.name}: the loss of a freshly built model is {float(loss.detach())}")
    try:
        correct = objective.correct(output, target)
        float(correct)
    except Exception as e:
        raise SpecError(f"{spec.name}: cannot count correct examples from the output ({describe_output(output)}) and "
                        f"targets of shape {tuple(target.shape)}: {one_line(e, with_type=True)}") from None
    if not 0 <= float(correct) <= batch_size:
        raise SpecError(f"{spec.name}: correct() gave {float(correct)} for {batch_size} examples: it must count "
                        "examples (0..batch size)")
    try:
        loss.backward()
    except Exception as e:
        raise SpecError(f"{spec.name}: backward through the loss failed: {one_line(e, with_type=True)}") from None
