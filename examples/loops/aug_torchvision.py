"""A correct DDP vision loop with random augmentation, as torchvision's references write one: a map-style
Dataset whose __getitem__ applies torchvision v2 transforms (RandomCrop, RandomHorizontalFlip), a
DistributedSampler with set_epoch, DataLoader workers (optional, persistent or not). Tiny synthetic images,
made here (no download).

    torchrun --nproc-per-node 2 examples/loops/aug_torchvision.py --batch-size 8 --workers 2
    python -m mgpu check-script examples/loops/aug_torchvision.py --batch-size "{16 // world_size}" --workers 2

Each rank offsets what must differ between ranks by its rank (torch's global generator after the model is
built, the DataLoader's generator that seeds its workers), after seeding alike what must agree (the model).
--seed-alike leaves the offsets out: every rank then draws the same augmentation (check-script names it).
--sampler plants a sampler bug: `none` (a shuffling DataLoader, no DistributedSampler: every rank reads the
same examples), `rank` (a DistributedSampler seeded with the rank: each rank shuffles otherwise).
--mixup mixes each batch with a Beta draw in collate_fn (not keyable: NOT VERIFIED).
--start-method spawn: workers that do not inherit the rank's patches (check-script's worker_init_fn wrapper keys them).
--amp bf16 | fp16: the forward and loss under autocast, as mixed precision is run; fp16 with a GradScaler.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data import default_collate
from torchvision.transforms import v2


class Images(Dataset):
    """Synthetic 3x16x16 uint8 images with a label, transformed in __getitem__."""

    def __init__(self, n=256, transform=None):
        g = torch.Generator().manual_seed(1234)
        self.images = torch.randint(0, 256, (n, 3, 16, 16), dtype=torch.uint8, generator=g)
        self.labels = (self.images[:, 0, :8].float().mean((1, 2)) > self.images[:, 1, 8:].float().mean((1, 2))).long()
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[i]


def mixup(batch):
    """MixUp in collate_fn: one Beta(0.4, 0.4) draw a batch from torch's global generator."""
    x, y = default_collate(batch)
    lam = torch.distributions.Beta(0.4, 0.4).sample()
    perm = torch.randperm(x.shape[0])
    return lam * x + (1 - lam) * x[perm], y


def pick_device(name):
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    parser.add_argument("--sampler", choices=["distributed", "none", "rank"], default="distributed")
    parser.add_argument("--seed-alike", action="store_true", help="no per-rank offset (the same draws on every rank)")
    parser.add_argument("--mixup", action="store_true")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default=None,
                        help="how DataLoader workers start (default: the platform's)")
    parser.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off")
    args = parser.parse_args()

    device, backend = pick_device(args.device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2))
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16")
    if not args.seed_alike:
        torch.manual_seed(1000 + rank)  # what must differ between ranks (dropout, noise): after the model

    transform = v2.Compose([v2.RandomCrop(12), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True)])
    dataset = Images(transform=transform)
    if args.sampler == "none":
        sampler = None  # the defect: every rank shuffles alike from torch's generator
    else:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=rank if args.sampler == "rank" else 0)
    generator = torch.Generator().manual_seed(2000 + (0 if args.seed_alike else rank))  # the workers' seeds
    if args.sampler == "none":
        generator = torch.Generator().manual_seed(2000)  # the shuffle's order: alike on every rank (the defect)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None,
                        drop_last=True, num_workers=args.workers, persistent_workers=args.persistent and args.workers > 0,
                        generator=generator, collate_fn=mixup if args.mixup else None,
                        multiprocessing_context=args.start_method if args.workers > 0 else None)

    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if rank == 0 and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
