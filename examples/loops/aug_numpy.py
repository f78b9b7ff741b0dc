"""A correct DDP loop whose Dataset augments with numpy's and Python's global generators in __getitem__, as
albumentations-style code does (a random crop from np.random, a flip from random.random), over a Subset
(what random_split returns, whose __getitems__ the DataLoader calls), a DistributedSampler with set_epoch.
numpy and random are never seeded: every process draws its own, as they would under torchrun.

    torchrun --nproc-per-node 2 examples/loops/aug_numpy.py --batch-size 8
    python -m mgpu check-script examples/loops/aug_numpy.py --batch-size "{16 // world_size}" --subset --workers 2

--rng: the dataset holds its own np.random.default_rng(0) for the crop (not keyable: NOT VERIFIED).
"""

import argparse
import random

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset


class NumpyImages(Dataset):
    """Synthetic float32 HWC images (numpy), cropped to 12x12 at random and flipped, as a CHW tensor."""

    def __init__(self, n=320, rng=False):
        data = np.random.default_rng(1234)  # the data themselves: fixed
        self.images = data.standard_normal((n, 16, 16, 3)).astype(np.float32)
        self.labels = (self.images[:, :8, :, 0].mean((1, 2)) > self.images[:, 8:, :, 1].mean((1, 2))).astype(np.int64)
        self.rng = np.random.default_rng(0) if rng else None

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        draw = self.rng if self.rng is not None else np.random
        top, left = (int(v) for v in draw.integers(0, 5, 2)) if self.rng is not None else np.random.randint(0, 5, 2)
        image = self.images[i, top:top + 12, left:left + 12]
        if random.random() < 0.5:
            image = image[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))), int(self.labels[i])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--subset", action="store_true", help="train on a Subset (every example but the last 64)")
    parser.add_argument("--rng", action="store_true", help="the dataset draws from a generator of its own")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    dataset = NumpyImages(rng=args.rng)
    if args.subset:
        dataset = Subset(dataset, list(range(len(dataset) - 64)))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.workers, generator=torch.Generator().manual_seed(100 + rank))

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
