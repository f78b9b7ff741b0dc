"""A DDP loop in which every rank saves the checkpoint to one path after each epoch (`torch.save` on every rank,
no rank check): at 2 ranks two processes write checkpoint.pt at once, a race that can leave the file torn.
`--whole-run` FAILS it (checkpoint-path: the path, the ranks, the line). The evaluation is exact (eval_exact.py).

    torchrun --nproc-per-node 2 examples/loops/save_every_rank.py --batch-size 8
    python -m mgpu check-script --whole-run examples/loops/save_every_rank.py --batch-size "{16 // world_size}"

--rank0: rank 0 alone saves, the others wait in a barrier (PASSES). --model-only: rank 0 saves the model's
weights and never the optimizer's momentum (finding checkpoint-optimizer: a resume restarts the optimizer).
--separate: rank 0 exports the model and saves the optimizer in a file of its own (PASSES, no finding).
--buffer: every rank saves into an io.BytesIO (no path: PASSES).
"""

import argparse
import io

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
    for flag in ("--rank0", "--model-only", "--separate", "--buffer"):
        parser.add_argument(flag, action="store_true")
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
        sums = torch.zeros(3)   # correct, examples, summed loss
        with torch.no_grad():
            for x, y in val_loader:
                out = model(x)
                sums += torch.tensor([(out.argmax(1) == y).sum().item(), len(y),
                                      F.cross_entropy(out, y, reduction="sum").item()])
        dist.all_reduce(sums)
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {sums[0] / sums[1]:.4f} loss {sums[2] / sums[1]:.4f} "
                  f"correct {int(sums[0])} of {int(sums[1])}")
        state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        if args.buffer:
            torch.save(state, io.BytesIO())   # a buffer (to send, or to measure): no file written
        elif args.model_only and rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
        elif args.separate and rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
            torch.save(optimizer.state_dict(), "optimizer.pt")
        elif args.rank0 and rank == 0:
            torch.save(state, "checkpoint.pt")
        elif not (args.rank0 or args.model_only or args.separate):
            torch.save(state, "checkpoint.pt")   # every rank, one path
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
