"""Run B's rounding-sized noise: what makes world 1's rerun differ from run A by as much as another
summation order makes world N differ from world 1 (compare.py's tolerance).

World N computes each example's forward and backward as world 1 does; what it sums in another order
is what adds up over the examples: every parameter's gradient (a sum over the batch, and over the
pixels or tokens of each example, of the terms each layer's output gradient makes), and what flows
back through the batch statistics of a BatchNorm. Such a sum's rounding is a few units of the terms
it adds, not of its result: a conv bias's gradient that is the small remainder of 10^4 terms of both
signs moves, under another order, by far more than its own last place. So run B moves

* every leaf module's output gradient, in the backward (`noise_output_gradients`): each term of every sum
  over the examples carries a rounding-sized difference, as another order's partial sums would;
* every parameter when its model is first called, and every gradient before the optimizer uses it
  (recorder.py): the rounding of the steps before carried into the next.

Each difference is `perturb * (|t| + rms(t))` per element with a random sign (`rounding_noise`),
drawn from a generator of its own, seeded by where it is made: the same in every run B.
"""

from __future__ import annotations

import torch

__all__ = ["rounding_noise", "noise_output_gradients"]


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


def noise_output_gradients(output, perturb: float, seed: int, own_units: bool = False) -> None:
    """Rounding noise on the gradient that reaches a leaf module's output in the backward: a hook on each
    floating tensor of it that autograd tracks (a tensor, or one in a tuple or list). The forward is left
    as it is, and nothing is copied: a tensor hook fires with the gradient of the value the module
    returned, even where the script changes it in place after (an inplace ReLU)."""
    tensors = output if isinstance(output, (tuple, list)) else (output,)
    for k, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad and t.grad_fn is not None:
            t.register_hook(lambda grad, k=k: None if grad is None else
                            grad + rounding_noise(grad, perturb, seed * 31 + k, own_units))
