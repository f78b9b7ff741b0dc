"""A correct DDP loop in mixed precision, as most training runs today: the forward under autocast, AdamW,
the gradient norm clipped, a cosine schedule after a linear warmup. One GPU a rank (nccl) where there
are GPUs, else the CPU (gloo).

    torchrun --nproc-per-node 2 examples/loops/ddp_amp.py --batch-size 24 --amp bf16
    python -m mgpu check-script examples/loops/ddp_amp.py --batch-size "{48 // world_size}" --amp bf16
    python -m mgpu check-script examples/loops/ddp_amp.py --batch-size "{48 // world_size}" --amp fp16
    python -m mgpu check-script examples/loops/ddp_amp.py --batch-size "{48 // world_size}" --amp off --model-dtype bfloat16

--amp bf16: `torch.autocast(dtype=torch.bfloat16)`; weights, gradients and AdamW's state stay float32.
--amp fp16: float16 autocast with a `torch.amp.GradScaler`: the loss scaled, the gradients unscaled
    before clipping (so the norm is the true one), a step whose gradients overflowed skipped.
--model-dtype bfloat16: the model cast whole to bfloat16 (weights, gradients, DDP's all-reduce and
    AdamW's state in bf16), the inputs cast to match, the loss taken in float32.
--batch-size is per device: keep the global batch with {48 // world_size}. The schedule counts
optimizer steps, which are the same at every world size when the global batch is.
"""

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_data(n=768, features=20, classes=4):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :classes].argmax(1) + (x[:, -1] > 1).long()) % classes
    return TensorDataset(x, y)


def cosine_with_warmup(optimizer, warmup, total):
    """The learning rate rises linearly over `warmup` steps, then falls along a half cosine to 0 at `total`."""
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=24, help="per device")
    parser.add_argument("--amp", choices=sorted(AMP_DTYPES), default="bf16", help="the autocast dtype")
    parser.add_argument("--model-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=4, help="optimizer steps")
    parser.add_argument("--max-norm", type=float, default=0.5)
    args = parser.parse_args()

    if torch.cuda.is_available():  # one GPU a rank, as torchrun's LOCAL_RANK says
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    dataset = make_data()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model_dtype = getattr(torch, args.model_dtype)
    model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 64), nn.GELU(),
                          nn.Dropout(0.1), nn.Linear(64, 4))
    model = DDP(model.to(device, model_dtype), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = cosine_with_warmup(optimizer, args.warmup, args.epochs * len(loader))
    amp_dtype = AMP_DTYPES[args.amp]
    autocast = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device, model_dtype), y.to(device)
            optimizer.zero_grad()
            with autocast:
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)  # clip the true gradient, not the scaled one
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
            scaler.step(optimizer)  # skipped where the gradients overflowed
            scaler.update()
            scheduler.step()
            if rank == 0 and step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
