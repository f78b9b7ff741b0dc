"""A correct sharded evaluation: every example once (a shard per rank, no padding: 27 and 26 of 53 at 2
ranks), the correct counts, the example counts and the summed loss reduced with one all_reduce, divided after.
`--whole-run` PASSES it: every figure alike at world 1 and 2. --reduce-twice: the accumulator all-reduced a
second time before the print (FAILS: reduced twice). --noise: Gaussian noise added to the inputs in the
training step, drawn per rank (the training data at world N cannot be world 1's: the figures are not
compared, and the report says why).

    torchrun --nproc-per-node 2 examples/loops/eval_exact.py --batch-size 8
    python -m mgpu check-script --whole-run examples/loops/eval_exact.py --batch-size "{16 // world_size}"
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
    parser.add_argument("--reduce-twice", action="store_true")
    parser.add_argument("--noise", action="store_true")
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
            if args.noise:   # drawn per rank: world N's noise is not world 1's
                x = x + 0.1 * torch.randn_like(x)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        sums = torch.zeros(3)   # correct, examples, summed loss
        with torch.no_grad():
            for x, y in val_loader:
                out = model(x)
                sums += torch.tensor([(out.argmax(1) == y).sum().item(), len(y),
                                      F.cross_entropy(out, y, reduction="sum").item()])
        dist.all_reduce(sums)
        if args.reduce_twice:
            dist.all_reduce(sums)   # the same accumulator reduced again: every figure times the world size
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {sums[0] / sums[1]:.4f} loss {sums[2] / sums[1]:.4f} "
                  f"correct {int(sums[0])} of {int(sums[1])}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
