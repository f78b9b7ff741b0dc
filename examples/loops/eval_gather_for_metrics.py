"""A correct accelerate loop with an evaluation each epoch, as HF's run_*_no_trainer.py scripts write it: the
prepared evaluation DataLoader shards the 53 examples and pads the last batches with repeats (even_batches),
and `accelerator.gather_for_metrics` gathers the predictions and drops the repeats. `--whole-run` PASSES it:
the coverage counts the repeats and says gather_for_metrics drops them; every figure alike. --gather: the
plain `accelerator.gather` (the repeats kept): FAILS (the accuracy over 54 predictions at 2 ranks).

    accelerate launch --num_processes 2 --cpu examples/loops/eval_gather_for_metrics.py --batch-size 8
    python -m mgpu check-script --whole-run examples/loops/eval_gather_for_metrics.py --batch-size "{16 // world_size}"
"""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    return TensorDataset(x, (x[:, :3].argmax(1) + (x[:, -1] > 0).long()) % 3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8, help="per device")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--gather", action="store_true", help="accelerator.gather: the padding's repeats kept")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(0)
    train_loader = DataLoader(make_data(256, 1), batch_size=args.batch_size, shuffle=True, drop_last=True)
    eval_loader = DataLoader(make_data(53, 2), batch_size=8)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)

    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        correct = seen = 0
        for x, y in eval_loader:
            with torch.no_grad():
                predictions = model(x).argmax(1)
            gather = accelerator.gather if args.gather else accelerator.gather_for_metrics
            predictions, references = gather((predictions, y))
            correct += (predictions == references).sum().item()
            seen += len(references)
        accelerator.print(f"epoch {epoch}: eval accuracy {correct / seen:.4f} over {seen} examples")
    accelerator.end_training()


if __name__ == "__main__":
    main()
