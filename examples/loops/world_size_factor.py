"""PLANTED DEFECT (the world-size factor): lm_global_tokens.py with the loss divided by the global token
count (all-reduced) but not multiplied back by the world size: DDP's average divides again, so
every gradient is 1/N of what it should be.

    torchrun --nproc-per-node 2 examples/loops/world_size_factor.py --batch-size 8
    python -m mgpu check-script examples/loops/world_size_factor.py --batch-size "{16 // world_size}"
    python -m mgpu check-script examples/loops/world_size_factor.py --batch-size "{16 // world_size}" --amp bf16
    python -m mgpu check-script examples/loops/world_size_factor.py --batch-size "{16 // world_size}" --model-dtype bfloat16
"""

import argparse

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
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per device")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--amp", choices=["off", "bf16"], default="off", help="bf16: the forward under autocast")
    parser.add_argument("--model-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: the model cast whole (weights, gradients, optimizer state)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    dataset = Sequences()
    loader = DataLoader(dataset, batch_size=args.batch_size, collate_fn=collate,
                        sampler=DistributedSampler(dataset, seed=0), drop_last=True)
    model = DDP(TinyLM().to(getattr(torch, args.model_dtype)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16")

    for step, (tokens, labels) in enumerate(loader):
        with autocast:
            logits = model(tokens).float()  # the loss in float32
        loss_sum = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        tokens_here = (labels != IGNORE).sum()
        tokens_global = tokens_here.clone()
        dist.all_reduce(tokens_global)
        loss = loss_sum / tokens_global  # the defect: DDP averages over the ranks on top
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
