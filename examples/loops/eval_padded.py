"""A DDP loop whose evaluation is sharded by DistributedSampler, which pads the 53 validation examples to a
multiple of the world size with duplicates (pytorch/pytorch#25162): at 2 ranks 54 are evaluated, one twice,
and the accuracy summed over the ranks counts it twice. `--whole-run` FAILS it (coverage: the loader's line,
1 duplicate at world 2, the fix). --truncate: the predictions gathered with all_gather in the sampler's order
and cut to the dataset's length (as gather_for_metrics does): PASSES, the padding said in a note (no figure shows it).

    torchrun --nproc-per-node 2 examples/loops/eval_padded.py --batch-size 8
    python -m mgpu check-script --whole-run examples/loops/eval_padded.py --batch-size "{16 // world_size}"
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
    parser.add_argument("--truncate", action="store_true", help="gather the predictions, cut the padding off")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train, val = make_data(256, 1), make_data(53, 2)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))  # pads to world's multiple
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
        if args.truncate:   # each rank's predictions gathered in the sampler's order, the padding cut off
            with torch.no_grad():
                hits = torch.cat([(model(x).argmax(1) == y).float() for x, y in val_loader])
            gathered = [torch.zeros_like(hits) for _ in range(world)]
            dist.all_gather(gathered, hits)
            hits = torch.stack(gathered, 1).reshape(-1)[:len(val)]   # rank r holds r, r + world, ...
            if rank == 0:
                print(f"epoch {epoch}: val accuracy {hits.mean():.4f} over {len(hits)} examples")
            continue
        counts = torch.zeros(2)   # correct, seen
        with torch.no_grad():
            for x, y in val_loader:
                counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
        dist.all_reduce(counts)
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {counts[0] / counts[1]:.4f} over {int(counts[1])} examples")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
