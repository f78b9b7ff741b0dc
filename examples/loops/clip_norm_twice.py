"""PLANTED DEFECT (the norm reduced twice): a DDP loop that clips the gradient by a global norm it
computes itself, all-reducing the squared norm over the ranks. DDP has already averaged the
gradients, so every rank holds the whole gradient: the sum over N ranks is N times the square, the
norm reads sqrt(N) times too large, and clipping cuts every gradient by 1/sqrt(N) too much.

    torchrun --nproc-per-node 2 examples/loops/clip_norm_twice.py --batch-size 16
    python -m mgpu check-script examples/loops/clip_norm_twice.py --batch-size "{32 // world_size}"
    python -m mgpu check-script examples/loops/clip_norm_twice.py --batch-size "{32 // world_size}" --amp bf16
    python -m mgpu check-script examples/loops/clip_norm_twice.py --batch-size "{32 // world_size}" --model-dtype bfloat16
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def clip_by_global_norm(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    sq = torch.stack([g.pow(2).sum() for g in grads]).sum()
    dist.all_reduce(sq)  # the defect: the gradients are already the same on every rank
    norm = sq.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)
    return norm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16, help="per device")
    parser.add_argument("--max-norm", type=float, default=0.05)
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="bf16: the forward under autocast")
    parser.add_argument("--model-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: the model cast whole (weights, gradients, optimizer state)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(512, 20, generator=g)
    y = torch.randint(0, 4, (512,), generator=g)
    dataset = TensorDataset(x, y)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=DistributedSampler(dataset, seed=0))
    dtype = getattr(torch, args.model_dtype)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)).to(dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")

    for x, y in loader:
        optimizer.zero_grad()
        with autocast:
            logits = model(x.to(dtype)).float()  # the loss in float32
        F.cross_entropy(logits, y).backward()
        clip_by_global_norm(model.parameters(), args.max_norm)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
