"""Run B's rounding-sized noise: what makes world 1's rerun differ from run A by as much as another
summation order makes world N differ from world 1 (compare.py's tolerance).

World N computes each example's forward and backward as world 1 does; what it sums in another order
is what adds up over the examples: every parameter's gradient (a sum over the batch, and over the
pixels or tokens of each example, of the terms each layer's output gradient makes), and what flows
back through the batch statistics of a BatchNorm. Such a sum's rounding is a few units of the terms
it adds, not of its result: a conv bias's gradient that is the small remainder of 10^4 terms of both
signs moves, under another order, by far more than its own last place. So run B moves

* every leaf module's output gradient, in the backward (`noisy_output`): each term of every sum
  over the examples carries a rounding-sized difference, as another order's partial sums would;
* every parameter when its model is first called, and every gradient before the optimizer uses it
  (recorder.py): the rounding of the steps before carried into the next.

Each difference is `perturb * (|t| + rms(t))` per element with a random sign (`rounding_noise`),
drawn from a generator of its own, seeded by where it is made: the same in every run B.
"""

from __future__ import annotations

import torch

__all__ = ["rounding_noise", "noisy_output"]


def rounding_noise(t: torch.Tensor, perturb: float, seed: int, own_units: bool = False) -> torch.Tensor:
    """perturb * (|t| + rms(t)) per element, with a random sign drawn from a generator seeded by `seed`
    on t's device. perturb is in float32's units (launch.PERTURB: two float32 roundings); a tensor of a
    lower precision (a model cast whole to bf16) gets as many roundings of its own dtype, since
    float32's would round away. With own_units, every dtype gets as many of its own (confirm.py's
    float64 runs: float64's roundings, the differences another order makes there)."""
    gen = torch.Generator(device=t.device).manual_seed(seed)
    sign = torch.randint(0, 2, tuple(t.shape), generator=gen, device=t.device).to(t.dtype) * 2 - 1
    work = t.detach() if t.dtype == torch.float64 else t.detach().float()
    rms = float(torch.linalg.vector_norm(work)) / max(1, t.numel()) ** 0.5 if t.numel() else 0.0
    ulps = torch.finfo(t.dtype).eps / torch.finfo(torch.float32).eps if t.is_floating_point() else 1.0
    ulps = ulps if own_units else max(1.0, ulps)
    return (perturb * ulps * (work.abs() + rms) * sign).to(t.dtype)


class _BackwardNoise(torch.autograd.Function):
    """The identity forward (a copy: the script may change it in place, an inplace ReLU after it); its
    backward adds rounding noise to the gradient flowing through."""

    @staticmethod
    def forward(ctx, x, perturb, seed, own_units):
        ctx.perturb, ctx.seed, ctx.own_units = perturb, seed, own_units
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None, None, None
        return grad + rounding_noise(grad, ctx.perturb, ctx.seed, ctx.own_units), None, None, None


def noisy_output(output, perturb: float, seed: int, own_units: bool = False):
    """A leaf module's output with noise on its gradient: each floating tensor that autograd tracks
    (a tensor, or one in a tuple or list), the rest as they are; None where nothing changes (the
    forward hook then keeps the module's own output)."""
    def wrap(t, k):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad:
            return _BackwardNoise.apply(t, perturb, seed * 31 + k, own_units)
        return t

    if isinstance(output, torch.Tensor):
        return wrap(output, 0) if output.is_floating_point() and output.requires_grad else None
    if isinstance(output, (tuple, list)) and any(isinstance(t, torch.Tensor) and t.requires_grad for t in output):
        wrapped = [wrap(t, k) for k, t in enumerate(output)]
        return type(output)(wrapped) if type(output) in (tuple, list) else None
    return None
