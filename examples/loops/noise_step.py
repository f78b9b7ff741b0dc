"""A DDP loop that adds Gaussian noise to its inputs in the training step (noise augmentation, a denoising
objective), drawn per rank from torch's global generator: correct training, but world N draws other noise
than world 1 for the same examples, and no check can key a draw made in the step to its example:
check-script says where it is drawn and ends NOT VERIFIED.

    torchrun --nproc-per-node 2 examples/loops/noise_step.py --batch-size 8
    python -m mgpu check-script examples/loops/noise_step.py --batch-size "{16 // world_size}"

--seed-alike: no per-rank offset after the model (torch.manual_seed(0) on every rank only): every rank then
draws the same noise for its examples (check-script names it, same-random-numbers).
--no-noise: the same loop without the noise (passes).
--noise-module: the noise drawn by a module without parameters called in the step (as GPU augmentation
libraries such as kornia do), not by a bare function call.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class GaussianNoise(nn.Module):
    """Noise augmentation as a module (no parameters), applied to the batch in the training step."""

    def forward(self, x):
        return x + 0.1 * torch.randn_like(x)


def make_data(n=512, features=20, classes=4):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :classes].argmax(1) + (x[:, -1] > 1).long()) % classes
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed-alike", action="store_true")
    parser.add_argument("--no-noise", action="store_true")
    parser.add_argument("--noise-module", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if not args.seed_alike:
        torch.manual_seed(1000 + rank)  # the noise: each rank its own

    dataset = make_data()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    noise = GaussianNoise()
    for step, (x, y) in enumerate(loader):
        if args.noise_module:
            x = noise(x)
        elif not args.no_noise:
            x = x + 0.1 * torch.randn_like(x)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
