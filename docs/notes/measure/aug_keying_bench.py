"""What keying augmentation to the example costs a DataLoader (mgpu/scriptcheck/keyed.py; issue 55's bound:
at most 10 % over a realistic per-example transform).

    .venv/bin/python docs/notes/measure/aug_keying_bench.py [--rounds 15] [--images 64] [--size 256]

A map-style dataset of JPEG bytes (made here: random smooth images, encoded once), each example decoded with
PIL and transformed as torchvision's classification reference trains (v2 RandomResizedCrop(224),
RandomHorizontalFlip, ToImage, ToDtype float32, Normalize). One DataLoader epoch (batch 16, num_workers=0:
the per-example cost in one process, where keying's share is largest) is timed with the fetcher as torch
ships it and keyed, interleaved (A B A B ...; the order of each pair alternates), `--rounds` pairs. The
figure is the median of the per-pair ratios keyed/plain, with the spread (min-max and interquartile) of the
ratios: a shared machine's load moves both halves of a pair alike. Also: the bare keying cost per example
(seeding and restoring three generators) over a dataset that does nothing. Say the load (uptime) with any
figure.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from mgpu.check.script.inrank.keyed import KeyedData


class Jpegs(Dataset):
    def __init__(self, n: int, size: int):
        rng = np.random.default_rng(0)
        self.blobs, self.labels = [], []
        for i in range(n):
            small = rng.integers(0, 256, (size // 16, size // 16, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((size, size), Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            self.blobs.append(buf.getvalue())
            self.labels.append(i % 10)
        self.transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                                     v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                     v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.blobs[i])).convert("RGB")
        return self.transform(img), self.labels[i]


class Nothing(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return i


def epoch_seconds(dataset, keyed: bool, batch: int = 16) -> float:
    k = KeyedData() if keyed else None
    if k is not None:
        k.install()
    try:
        loader = DataLoader(dataset, batch_size=batch, shuffle=False)
        start = time.perf_counter()
        for _ in loader:
            pass
        return time.perf_counter() - start
    finally:
        if k is not None:
            k.uninstall()


def interleaved(dataset, rounds: int) -> dict:
    ratios, plain, keyed = [], [], []
    epoch_seconds(dataset, False)
    epoch_seconds(dataset, True)  # warm both
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        t = {k: epoch_seconds(dataset, k) for k in order}
        plain.append(t[False])
        keyed.append(t[True])
        ratios.append(t[True] / t[False])
    q = statistics.quantiles(ratios, n=4)
    return {"rounds": rounds, "plain_median_s": statistics.median(plain), "keyed_median_s": statistics.median(keyed),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratio_q1": q[0], "ratio_q3": q[2]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {os.getloadavg()}")
    real = interleaved(Jpegs(args.images, args.size), args.rounds)
    print(f"JPEG {args.size}px decode + RandomResizedCrop(224) + flip + normalize, {args.images} images, "
          f"batch 16, num_workers=0, {args.rounds} interleaved pairs:")
    print(f"  plain {real['plain_median_s'] * 1e3 / args.images:.3f} ms/example, keyed "
          f"{real['keyed_median_s'] * 1e3 / args.images:.3f} ms/example (medians)")
    print(f"  keyed/plain: median {real['ratio_median']:.3f}, interquartile {real['ratio_q1']:.3f}-"
          f"{real['ratio_q3']:.3f}, range {real['ratio_min']:.3f}-{real['ratio_max']:.3f}")
    bare = interleaved(Nothing(), max(5, args.rounds // 3))
    per = (bare["keyed_median_s"] - bare["plain_median_s"]) / len(Nothing()) * 1e6
    print(f"  bare keying cost: about {per:.1f} us/example (a dataset that returns its index; "
          f"keyed/plain {bare['ratio_median']:.2f})")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
