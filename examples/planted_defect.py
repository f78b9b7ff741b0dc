"""A model with a planted data-parallel defect: a running statistic of the batch, kept in a buffer.

    python -m mgpu check examples/planted_defect.py:defect --input-shape 3,8,8 --classes 4   # fails (exit 1)
    python -m mgpu check examples/planted_defect.py:fixed --input-shape 3,8,8 --classes 4    # passes

`defect` scales its input by a running mean of the input's magnitude, a buffer replaced in every
training forward (`self.batch_scale = ...`). On N devices each replica computes that mean from
its own shard, so the buffer is not what one device computes from the whole batch (the replicas
agree only because rank 0's buffers are copied to the others), and from step 2 on every forward
divides by a value single-device training never had.

What `mgpu check ...:defect` says (manual and ddp fail on 2 and 3 devices; dataparallel, a
pass-through on a CPU, passes):

    findings (the model's, not mgpu's; they do not fail the check unless --strict):
      forward-buffers: buffers written by a training forward: batch_scale (reassigned: batch_scale):
        each device writes them from its own shard; ...
    12 check(s) FAILED; the first divergence of each:
      manual x2 devices, buffers: buffer batch_scale differs after step 1 on replica 0 from the
        single-device float64 run: largest absolute error 1.084e-04, relative 1.141e-04 (allowed 7.25e-06)
        cause: buffer batch_scale is computed from the batch in forward (reassigned: self.batch_scale
        = ...): each device computes it from its own shard and the first device's is kept, so it is
        not the single-device value; make it a statistic of the global batch (all_reduce it), or keep
        it out of the model's state
        reproduce: python -m mgpu check examples/planted_defect.py:defect --input-shape 3,8,8 --classes 4
          --strategies manual --devices 2 --batch-size 12 --steps 3 --seed 0 --accumulate 2
      ddp x2 ranks, buffers: (the same, on rank 0)

The fix. Updating the buffer in place (`self.batch_scale.mul_(0.9).add_(0.1 * m)`, or `.copy_()`)
removes the finding but not the failures: each device still computes the statistic from its own
shard (and PyTorch's DDP has broadcast reassigned buffers since 1.10). What fixes it is a scale
that does not depend on how the batch is cut: `fixed` divides each example by its own mean
magnitude and keeps no state.
"""

import torch
from torch import nn


class ScaledNet(nn.Module):
    """A small CNN that divides its input by its mean magnitude: a running mean over batches
    (in a buffer: the defect), or each example's own (fixed)."""

    def __init__(self, channels=3, classes=4, running=True, momentum=0.1):
        super().__init__()
        self.running, self.momentum = running, momentum
        if running:
            self.register_buffer("batch_scale", torch.ones(()))  # running mean of |x| over batches
        self.conv = nn.Conv2d(channels, 8, 3, padding=1)
        self.head = nn.Linear(8, classes)

    def forward(self, x):  # x: (B, C, H, W)
        if self.running:
            scale = self.batch_scale  # (), the same for every example
            if self.training:  # THE DEFECT: a statistic of this device's shard, in the model's state
                self.batch_scale = (1 - self.momentum) * self.batch_scale + self.momentum * x.detach().abs().mean()
        else:
            scale = x.abs().mean(dim=(1, 2, 3), keepdim=True).clamp_min(1e-6)  # (B, 1, 1, 1), each example its own
        h = torch.relu(self.conv(x / scale))  # (B, 8, H, W)
        return self.head(h.mean(dim=(2, 3)))  # (B, classes)


def defect():
    return ScaledNet(running=True)


def fixed():
    return ScaledNet(running=False)
