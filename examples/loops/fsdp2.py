"""A correct FSDP2 loop: every block and the root under `fully_shard`, AdamW on the sharded (DTensor)
parameters, DistributedSampler, the gradient norm clipped (FSDP2's clip_grad_norm_ reduces over
the shards itself).

    torchrun --nproc-per-node 2 examples/loops/fsdp2.py --batch-size 8
    python -m mgpu check-script examples/loops/fsdp2.py --batch-size "{16 // world_size}"
    python -m mgpu check-script examples/loops/fsdp2.py --batch-size "{16 // world_size}" --mixed-precision bf16

--mixed-precision bf16: `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)`: each
unit's parameters all-gathered and computed in bfloat16, its gradients reduce-scattered in float32; the
sharded weights and AdamW stay float32. It runs on gloo as on nccl.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, features=24, width=32, depth=3, classes=5):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--mixed-precision", choices=["off", "bf16"], default="off")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)

    g = torch.Generator().manual_seed(7)
    x = torch.randn(400, 24, generator=g)
    y = torch.randint(0, 5, (400,), generator=g)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = Net()
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if args.mixed_precision == "bf16" else MixedPrecisionPolicy())
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    for step, (xb, yb) in enumerate(loader):
        loss = F.cross_entropy(model(xb).float(), yb)  # the loss in float32
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        optimizer.step()
        optimizer.zero_grad()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
