"""An early stop decided on rank 0 alone (Lightning-AI/pytorch-lightning#379): rank 0 evaluates, and when its
accuracy reaches --target it leaves the epoch loop, while the other ranks go on to the next epoch and wait
in DDP's gradient all-reduce for ever (a hang under torchrun). `--whole-run` FAILS it within seconds,
naming rank 0, where it left and where the others wait. early_stop_reduced.py broadcasts the decision.

    python -m mgpu check-script --whole-run examples/loops/early_stop_rank0.py --batch-size "{16 // world_size}"
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
    parser.add_argument("--target", type=float, default=0.2, help="stop once the accuracy reaches this")
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
        sampler.set_epoch(epoch)
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
            if correct / len(val) >= args.target:  # decided on rank 0 alone: the other ranks never hear of it
                break
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
