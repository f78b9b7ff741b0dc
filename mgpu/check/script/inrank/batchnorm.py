"""BatchNorm as SyncBatchNorm would compute it, on any device: what check-script puts in at every
world size (recorder.py), so that the rest of a loop whose BatchNorm normalises per rank is still
compared, and so that world 1 and world N compute BatchNorm with the same arithmetic."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SyncedBatchNorm"]


class SyncedBatchNorm:
    """A BatchNorm's forward with the batch statistics of the global batch, as SyncBatchNorm computes
    them (which torch offers only on GPUs): the sums all-reduced over the ranks with autograd-aware
    collectives, so that backward reduces through them too. At world N this takes away the one
    difference from world 1 that BatchNorm makes by design, and the rest of the loop is compared;
    the batch-mixing finding says the script itself normalises per rank.

    World 1 (one rank, or no process group) computes the same way, its sums not reduced: torch's own
    BatchNorm kernel rounds otherwise than these float64 sums, and through twenty BatchNorms over a
    few examples each (a ResNet's last stage sees one pixel an example) that difference grows past
    what the rerun's perturbation shows; the verdict of a correct script then depended on the rerun's
    draw. Outside training the module's own forward runs."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.original = module.forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        m = self.module
        uses_batch = m.training or (m.running_mean is None and m.running_var is None)
        if not uses_batch:
            return self.original(x)
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if distributed:
            from torch.distributed.nn.functional import all_reduce
        else:
            all_reduce = _alone

        factor = 0.0 if m.momentum is None else m.momentum
        if m.training and m.track_running_stats and m.num_batches_tracked is not None:
            m.num_batches_tracked.add_(1)
            factor = 1.0 / float(m.num_batches_tracked) if m.momentum is None else m.momentum
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        count = torch.tensor([float(x.numel() // x.shape[1])], dtype=torch.float64, device=x.device)
        if distributed:
            dist.all_reduce(count)
        total = float(count.item())
        mean = all_reduce(x.double().sum(dims)) / total
        centred = x - mean.to(x.dtype).view(shape)
        var = all_reduce((centred.double() ** 2).sum(dims)) / total
        y = centred * torch.rsqrt(var + m.eps).to(x.dtype).view(shape)
        if m.affine:
            y = y * m.weight.view(shape) + m.bias.view(shape)
        if m.training and m.track_running_stats and m.running_mean is not None:
            with torch.no_grad():
                m.running_mean.mul_(1 - factor).add_(factor * mean.to(m.running_mean.dtype))
                unbiased = var * total / max(total - 1, 1.0)
                m.running_var.mul_(1 - factor).add_(factor * unbiased.to(m.running_var.dtype))
        return y


def _alone(t: torch.Tensor) -> torch.Tensor:
    """The all-reduce of one rank: its own sums."""
    return t
