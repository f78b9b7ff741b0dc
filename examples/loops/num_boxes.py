"""PLANTED DEFECT (a loss normaliser per rank, DETR's num_boxes): a detection-style regression loss
summed over each image's boxes (a different number per image) and divided by the number of boxes
on this rank. DETR all-reduces num_boxes over the ranks and divides by that over the world size;
here each rank divides by its own, so a box's weight depends on the rank it lands on.

    torchrun --nproc-per-node 2 examples/loops/num_boxes.py --batch-size 8
    python -m mgpu check-script examples/loops/num_boxes.py --batch-size "{16 // world_size}"
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MAX_BOXES = 6


class BoxHead(nn.Module):
    def __init__(self, features=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.boxes = nn.Linear(64, MAX_BOXES * 4)

    def forward(self, x):
        return self.boxes(self.body(x)).view(-1, MAX_BOXES, 4).sigmoid()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="images per device")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(21)
    images = torch.randn(320, 32, generator=g)
    boxes = torch.rand(320, MAX_BOXES, 4, generator=g)
    counts = torch.randint(0, MAX_BOXES + 1, (320,), generator=g)
    valid = torch.arange(MAX_BOXES)[None, :] < counts[:, None]
    dataset = TensorDataset(images, boxes, valid)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=DistributedSampler(dataset, seed=0))

    model = DDP(BoxHead())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, target, mask in loader:
        pred = model(x)
        l1 = F.l1_loss(pred, target, reduction="none").sum(-1)
        num_boxes = mask.sum().clamp(min=1)  # the defect: this rank's boxes, not all-reduced
        loss = (l1 * mask).sum() / num_boxes
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
