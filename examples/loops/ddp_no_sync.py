"""A correct gradient-accumulation loop under DDP: `no_sync()` on every micro-batch but the last of a
window, each micro-batch's mean loss divided by the number of micro-batches (right here: every
micro-batch holds the same number of examples, and every example weighs the same).

    torchrun --nproc-per-node 2 examples/loops/ddp_no_sync.py --micro-batch 4 --accumulate 4
    python -m mgpu check-script examples/loops/ddp_no_sync.py --micro-batch "{8 // world_size}" --accumulate 4
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batch", type=int, default=4, help="examples per device and micro-batch")
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(600, 10, generator=g)
    y = torch.randint(0, 2, (600,), generator=g)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=args.micro_batch, sampler=sampler, drop_last=True)

    model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for i, (xb, yb) in enumerate(loader):
        last = (i + 1) % args.accumulate == 0
        with contextlib.nullcontext() if last else model.no_sync():
            loss = F.cross_entropy(model(xb), yb) / args.accumulate
            loss.backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
