"""A DDP loop over several epochs that never calls `sampler.set_epoch(epoch)` (pytorch/pytorch#31771): its
DistributedSampler gives every epoch the order of epoch 1, at every world size (world 1 included, since
it uses the sampler too). Otherwise as epochs_set_epoch.py. `--whole-run` FAILS it (epoch-order).

    python -m mgpu check-script --whole-run examples/loops/epochs_no_set_epoch.py --batch-size "{16 // world_size}"
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
    train, val = make_data(256, 1), make_data(64, 2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    for epoch in range(args.epochs):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        if rank == 0:  # the whole validation set, on rank 0 alone
            model.eval()
            with torch.no_grad():
                correct = sum((model.module(x).argmax(1) == y).sum().item() for x, y in DataLoader(val, batch_size=32))
            print(f"epoch {epoch}: accuracy {correct / len(val):.3f}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
