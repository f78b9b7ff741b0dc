"""nanoGPT's way to feed a DDP loop: no DataLoader; each step every rank draws its own batch with replacement
(`torch.randint` offsets into one token stream), its generator seeded `1337 + rank`. A choice, not a bug:
world N trains on other examples than world 1 by design, so check-script cannot compare the steps and ends
NOT VERIFIED, naming the draw (file:line) and how to make them comparable.

    torchrun --nproc-per-node 2 examples/loops/randint_batches.py --batch-size 8
    python -m mgpu check-script examples/loops/randint_batches.py --batch-size "{16 // world_size}"

--seed-alike: every rank seeded 1337: every rank draws the same batch (FAILED: every rank saw the same examples).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

BLOCK, VOCAB = 8, 32


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--seed-alike", action="store_true")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = torch.randint(0, VOCAB, (4096,), generator=torch.Generator().manual_seed(0))  # the token stream
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Embedding(VOCAB, 16), nn.Flatten(), nn.Linear(16 * BLOCK, VOCAB)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1337 + (0 if args.seed_alike else rank))

    def get_batch():
        ix = torch.randint(len(data) - BLOCK - 1, (args.batch_size,))
        x = torch.stack([data[i:i + BLOCK] for i in ix])
        return x, data[ix + BLOCK]

    for _ in range(8):
        x, y = get_batch()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
