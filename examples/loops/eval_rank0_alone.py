"""A correct evaluation on rank 0 alone: after each epoch rank 0 evaluates the whole validation set (the module
under DDP, outside DDP's forward, no_grad) while the others wait in a barrier, and after training a final test
on a held-out set, the figure people publish. `--whole-run` PASSES it: rank 0 covers world 1's whole set at
every world size, every figure alike.

    torchrun --nproc-per-node 2 examples/loops/eval_rank0_alone.py --batch-size 8
    python -m mgpu check-script --whole-run examples/loops/eval_rank0_alone.py --batch-size "{16 // world_size}"
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def evaluate(model, data):
    """Accuracy and mean loss over the whole set, in this process alone."""
    model.eval()
    correct = loss = 0.0
    with torch.no_grad():
        for x, y in DataLoader(data, batch_size=16):
            out = model(x)
            correct += (out.argmax(1) == y).sum().item()
            loss += F.cross_entropy(out, y, reduction="sum").item()
    return correct / len(data), loss / len(data)


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
    train, val, test = make_data(256, 1), make_data(53, 2), make_data(41, 3)
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
        if rank == 0:   # the whole validation set, on rank 0 alone
            accuracy, loss = evaluate(model.module, val)
            print(f"epoch {epoch}: val accuracy {accuracy:.4f} val loss {loss:.4f}")
        dist.barrier()
    if rank == 0:
        accuracy, loss = evaluate(model.module, test)
        print(f"test accuracy {accuracy:.4f} test loss {loss:.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
