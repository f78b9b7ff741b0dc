"""PLANTED DEFECT (an accumulation window weighted per micro-batch): lm_global_tokens.py with gradient
accumulation under DDP's no_sync, each micro-batch's loss its mean over its own real tokens divided by
the number of micro-batches. Micro-batches hold different numbers of tokens, so a token's weight
depends on the micro-batch (and the rank) it lands in; at N ranks the micro-batches are cut
differently, and the gradients change.

    torchrun --nproc-per-node 2 examples/loops/accum_per_microbatch.py --micro-batch 4 --accumulate 2
    python -m mgpu check-script examples/loops/accum_per_microbatch.py --micro-batch "{8 // world_size}" --accumulate 2
    python -m mgpu check-script examples/loops/accum_per_microbatch.py --micro-batch "{8 // world_size}" --accumulate 2 --amp bf16
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, DistributedSampler

VOCAB, PAD, IGNORE = 50, 0, -100


class Sequences(torch.utils.data.Dataset):
    def __init__(self, n=256, seed=11):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, 20, (n,), generator=g)
        self.items = [torch.randint(1, VOCAB, (int(k),), generator=g) for k in lengths]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    """Pad to the longest sequence of this batch (each rank pads its own)."""
    tokens = pad_sequence(batch, batch_first=True, padding_value=PAD)
    labels = pad_sequence([s[1:] for s in batch], batch_first=True, padding_value=IGNORE)
    labels = F.pad(labels, (0, tokens.shape[1] - labels.shape[1]), value=IGNORE)
    return tokens, labels


class TinyLM(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width, padding_idx=PAD)
        self.mix = nn.Conv1d(width, width, kernel_size=3, padding=2)  # causal: trimmed below
        self.out = nn.Linear(width, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens).transpose(1, 2)
        h = torch.tanh(self.mix(h)[..., :tokens.shape[1]]).transpose(1, 2)
        return self.out(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per device and micro-batch")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="bf16: the forward under autocast")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    dataset = Sequences()
    loader = DataLoader(dataset, batch_size=args.micro_batch, collate_fn=collate,
                        sampler=DistributedSampler(dataset, seed=0), drop_last=True)
    model = DDP(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")

    for i, (tokens, labels) in enumerate(loader):
        last = (i + 1) % args.accumulate == 0
        with contextlib.nullcontext() if last else model.no_sync():
            with autocast:
                logits = model(tokens).float()  # the loss in float32
            # the defect: each micro-batch's mean over its own tokens, weighted 1/accumulate
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE) / args.accumulate
            loss.backward()
        if last:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
