"""How far the manual strategy's allreduced ResNet-18 gradient is from the single-device one on
PyTorch's default CPU path (oneDNN on): the bound `ONEDNN_TOL` of
correctness/test_gradients.py::test_resnet18_allreduced_gradient_on_the_default_cpu_path.

    python docs/notes/measure/onednn_bound.py [CASES]     # default 3000 random cases, a few minutes on 2 cores

Shards of another batch size than the whole batch take other oneDNN kernels, so the two differ by
more than float32 rounding of the same arithmetic. Per case (seed, batch 1..12, 1..4 devices,
mean or sum loss, as the test draws them): max over replicas and parameters of
|manual - single| / max|single|. Prints the largest ratios and quantiles; figures in docs/notes/perf.md.
"""

from __future__ import annotations

import random
import sys

import torch

from correctness.helpers import make_model, manual_gradients, max_abs_diff, random_batch, reference_gradients
from mgpu.devices import torch_threads


def ratio(seed: int, batch: int, n: int, reduction: str) -> float:
    model = make_model("resnet18", seed).eval()
    X, y = random_batch(batch, seed)
    _, replicas = manual_gradients(model, X, y, n, reduction, devices=[torch.device("cpu")] * n)
    expected = reference_gradients(model, X, y, reduction)
    return max(max_abs_diff(g[k], w) / float(w.double().abs().max())
               for g in replicas for k, w in expected.items() if float(w.abs().max()) > 0)


def main(cases: int) -> None:
    rng = random.Random(0)
    found = []
    with torch_threads(1):  # as the suite runs it
        for i in range(cases):
            n = rng.randint(1, 4)
            batch = rng.randint(n, 12)
            seed, reduction = rng.randrange(2**31), rng.choice(["mean", "sum"])
            found.append((ratio(seed, batch, n, reduction), seed, batch, n, reduction))
            if (i + 1) % 500 == 0:
                print(f"{i + 1} cases, largest so far {max(found)[0]:.3g}", file=sys.stderr, flush=True)
    found.sort(reverse=True)
    values = sorted(f[0] for f in found)
    q = lambda p: values[min(len(values) - 1, int(p * len(values)))]  # noqa: E731
    print(f"{cases} cases (torch {torch.__version__}, one thread): median {q(0.5):.3g}, 99th percentile "
          f"{q(0.99):.3g}, 99.9th {q(0.999):.3g}, largest {values[-1]:.3g}")
    for r, seed, batch, n, reduction in found[:5]:
        print(f"  {r:.3g}: seed {seed}, batch {batch} over {n} devices, {reduction} loss")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
