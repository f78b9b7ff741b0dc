"""PLANTED DEFECT (the linear scaling rule under warmup): a DDP loop with AdamW and a linear warmup
(LambdaLR) whose learning rate is multiplied by the world size, as the linear scaling rule says for a
global batch that grows with the ranks. Here the global batch is kept (--batch-size is per device,
`{48 // world_size}`), so world N steps N times further than world 1. The warmup starts at zero and
its first updates (lr * step / warmup, about 1e-6) are far below the weights' rounding tolerance:
the weights of both worlds agree for many steps, and the learning rates differ from step 2 on.
`--keep-lr` is the correct twin: the learning rate the same at every world size.

    torchrun --nproc-per-node 2 examples/loops/warmup_lr_scaled.py --batch-size 24
    python -m mgpu check-script examples/loops/warmup_lr_scaled.py --batch-size "{48 // world_size}"
    python -m mgpu check-script examples/loops/warmup_lr_scaled.py --batch-size "{48 // world_size}" --keep-lr
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n=768, features=20, classes=4):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :classes].argmax(1) + (x[:, -1] > 1).long()) % classes
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=24, help="per device")
    parser.add_argument("--lr", type=float, default=1e-3, help="the peak learning rate, at world 1")
    parser.add_argument("--warmup", type=int, default=1000, help="optimizer steps from 0 to the peak")
    parser.add_argument("--keep-lr", action="store_true", help="the correct twin: no scaling by the world size")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    dataset = make_data()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 4)))
    lr = args.lr if args.keep_lr else args.lr * world  # the defect: the global batch did not grow
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / args.warmup))

    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
