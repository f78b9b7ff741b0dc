"""A correct HF accelerate loop: Accelerator.prepare shards the DataLoader and wraps the model in DDP;
accelerator.backward, accelerator.clip_grad_norm_ (over the averaged gradients), a scheduler.

    accelerate launch --num_processes 2 --cpu examples/loops/accelerate_loop.py --batch-size 8
    python -m mgpu check-script examples/loops/accelerate_loop.py --batch-size "{16 // world_size}"
    python -m mgpu check-script examples/loops/accelerate_loop.py --batch-size "{16 // world_size}" --mixed-precision bf16

The batch size is per device, as accelerate's DataLoader shards by whole batches (split_batches=False).
"""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--mixed-precision", choices=["no", "bf16"], default="no",
                        help="Accelerator(mixed_precision=...): bf16 autocast around the prepared model's forward")
    args = parser.parse_args()

    # A sampler seeded by set_seed, the same at every world size (the default draws its order from a
    # generator accelerate synchronises only when distributed: world 1 would shuffle otherwise).
    # step_scheduler_with_optimizer=False: by default accelerate steps a prepared scheduler once per process
    # at every optimizer step (its schedule counts per-device batches), so the learning rate would fall N
    # times faster at N processes (accelerate_scheduler.py shows what the check says about that).
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
                              step_scheduler_with_optimizer=False, mixed_precision=args.mixed_precision)
    set_seed(0)

    g = torch.Generator().manual_seed(5)
    x = torch.randn(320, 12, generator=g)
    y = torch.randint(0, 3, (320,), generator=g)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)

    model = nn.Sequential(nn.Linear(12, 48), nn.GELU(), nn.Dropout(0.1), nn.Linear(48, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.1, total_iters=50)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    for step, (xb, yb) in enumerate(loader):
        loss = F.cross_entropy(model(xb), yb)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step % 10 == 0:
            accelerator.print(f"step {step} loss {loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
