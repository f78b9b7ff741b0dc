"""PLANTED DEFECT (unsharded data): ddp_sampler.py with a DataLoader that shuffles by itself, no
DistributedSampler. torch.manual_seed(0) runs on every rank, so every rank draws the same order and
trains on the same examples: the global batch at N ranks is N copies of one rank's batch.

    torchrun --nproc-per-node 2 examples/loops/no_sampler.py --batch-size 16
    python -m mgpu check-script examples/loops/no_sampler.py --batch-size "{32 // world_size}"
    python -m mgpu check-script examples/loops/no_sampler.py --batch-size "{32 // world_size}" --amp bf16
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def make_data(n=512, features=20, classes=4):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :classes].argmax(1) + (x[:, -1] > 1).long()) % classes
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16, help="per device")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="bf16: the forward under autocast")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    dataset = make_data()
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)  # the defect: no sampler

    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")

    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            with autocast:
                logits = model(x).float()  # the loss in float32
            loss = F.cross_entropy(logits, y)
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
