"""A correct hand-made data-parallel loop: no DDP. Rank 0's weights are broadcast at the start, each
rank's gradients are all-reduced (summed) and divided by the world size before the step.

    torchrun --nproc-per-node 2 examples/loops/allreduce.py --batch-size 16
    python -m mgpu check-script examples/loops/allreduce.py --batch-size "{32 // world_size}"
    python -m mgpu check-script examples/loops/allreduce.py --batch-size "{32 // world_size}" --amp bf16
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def batches(batch_size, rank, world, steps=100):
    """Shard by hand: the global batch of step s is examples [s*B*world, (s+1)*B*world), rank r takes
    its slice."""
    g = torch.Generator().manual_seed(99)
    x = torch.randn(steps * batch_size * world, 16, generator=g)
    y = x @ torch.randn(16, 3, generator=g) + 0.1 * torch.randn(len(x), 3, generator=g)
    for s in range(steps):
        start = (s * world + rank) * batch_size
        yield x[start:start + batch_size], y[start:start + batch_size]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16, help="per device")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="bf16: the forward under autocast")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(int(os.environ.get("SEED", "0")) + rank)  # each rank its own init: broadcast below

    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 3))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")

    for step, (x, y) in enumerate(batches(args.batch_size, rank, world, args.steps)):
        optimizer.zero_grad()
        with autocast:
            prediction = model(x).float()  # the loss in float32
        loss = F.mse_loss(prediction, y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
