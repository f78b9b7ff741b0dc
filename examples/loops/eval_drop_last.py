"""A DDP loop whose evaluation drops each rank's partial last batch (`drop_last=True` in the evaluation
DataLoader): of 53 validation examples, world 1 evaluates 48 (three batches of 16) and 2 ranks 32 (one batch of
16 each of their 27): the accuracy printed at 2 ranks rests on other examples than at 1. `--whole-run` FAILS it
(coverage: 16 of world 1's examples evaluated by no rank, the loader's line, drop_last=False).

    torchrun --nproc-per-node 2 examples/loops/eval_drop_last.py --batch-size 8
    python -m mgpu check-script --whole-run examples/loops/eval_drop_last.py --batch-size "{16 // world_size}"
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    return TensorDataset(x, (x[:, :3].argmax(1) + (x[:, -1] > 0).long()) % 3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16, help="per device")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train, val = make_data(256, 1), make_data(53, 2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val, batch_size=16, sampler=DistributedSampler(val, shuffle=False), drop_last=True)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        counts = torch.zeros(2)   # correct, seen
        with torch.no_grad():
            for x, y in val_loader:
                counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
        dist.all_reduce(counts)
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {counts[0] / counts[1]:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
