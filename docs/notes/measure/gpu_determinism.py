"""Two identical trainings on one GPU, with PyTorch's defaults and under mgpu.devices.exact_gpu_math:
do they agree to the bit? And does --data-on-device change anything?

    PYTHONPATH=. python3 docs/notes/measure/gpu_determinism.py      # needs a CUDA device

docs/notes/gpu-runs.md has what it printed on an H200.
"""

import contextlib
import dataclasses

import torch

from mgpu.config import TrainConfig
from mgpu.devices import exact_gpu_math
from mgpu.run import train

BASE = TrainConfig(strategy="single", model="resnet18", width=4, epochs=1, batch_size=16, train_size=64,
                   test_size=40, lr=0.05, out=None, progress=False, seed=3)


def largest_difference(a, b) -> float:
    return max((a.state_dict[k].double() - b.state_dict[k].double()).abs().max().item() for k in a.state_dict)


def main():
    assert torch.cuda.is_available(), "needs a CUDA device"
    for label, settings in (("PyTorch defaults", contextlib.nullcontext), ("exact_gpu_math", exact_gpu_math)):
        with settings():
            runs = {on: [train(dataclasses.replace(BASE, data_on_device=on)) for _ in range(2)] for on in (False, True)}
        for on, (a, b) in runs.items():
            print(f"{label}: data_on_device={on}: two identical runs differ by at most {largest_difference(a, b):.3g}")
        print(f"{label}: host data vs --data-on-device differ by at most {largest_difference(runs[False][0], runs[True][0]):.3g}")


if __name__ == "__main__":
    main()
