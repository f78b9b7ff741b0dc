"""A correct DDP loop over torchvision's ResNet-18 (BatchNorm in training mode), SGD with momentum:
the BatchNorm network of the repeated-checks measurement (docs/notes/measure/repeat_checks.py).

    torchrun --nproc-per-node 2 resnet_bn_ddp.py --batch-size 8 [--amp bf16] [--size 32]
"""
import argparse
import os

import torch
import torch.distributed as dist
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--amp", choices=["none", "bf16"], default="none")
parser.add_argument("--size", type=int, default=32, help="image side")
args = parser.parse_args()

torch.manual_seed(0)
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo")
rank = dist.get_rank() if world > 1 else 0
model = torchvision.models.resnet18(num_classes=10)
if world > 1:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
data = torch.Generator().manual_seed(1)
images, labels = torch.randn(256, 3, args.size, args.size, generator=data), torch.randint(0, 10, (256,), generator=data)
global_batch = args.batch_size * world
for step in range(8):
    rows = slice(step * global_batch + rank * args.batch_size, step * global_batch + (rank + 1) * args.batch_size)
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
        loss = torch.nn.functional.cross_entropy(model(images[rows]), labels[rows])
    loss.backward()
    opt.step()
