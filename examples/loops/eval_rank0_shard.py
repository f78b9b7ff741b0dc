"""A DDP loop whose evaluation is sharded (every example once: 27 and 26 of 53 at 2 ranks), and rank 0 prints
its own shard's accuracy as the accuracy: no collective between the evaluation and the print
(pytorch/examples#905). `--whole-run` FAILS it (figure 'val accuracy': rank 0's 27 of world 1's 53 examples,
no collective between the evaluation and the line).

    torchrun --nproc-per-node 2 examples/loops/eval_rank0_shard.py --batch-size 8
    python -m mgpu check-script --whole-run examples/loops/eval_rank0_shard.py --batch-size "{16 // world_size}"
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


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
    val_loader = DataLoader(Subset(val, range(rank, len(val), world)), batch_size=8)  # every example once, 27 + 26
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
        correct = seen = 0
        with torch.no_grad():
            for x, y in val_loader:
                correct += (model(x).argmax(1) == y).sum().item()
                seen += len(y)
        if rank == 0:   # rank 0's shard, reported as the whole
            print(f"epoch {epoch}: val accuracy {correct / seen:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
