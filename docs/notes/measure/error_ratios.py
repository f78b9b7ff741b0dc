"""How far a data-parallel float32 step is from the float64 reference step, in units of the
single-device float32 step's own distance: the ratio that mgpu.check.tolerance.FACTOR bounds.

    python docs/notes/measure/error_ratios.py        # a few minutes on 2 cores; figures: docs/notes/check-runs.md

For each model, seed, device count and batch size (even and uneven shards): the manual strategy's
run (in process), and for every step the float64 and float32 reference steps from the run's own
state, as `mgpu check` compares them; the ratio per tensor and step, of weights, buffers and the
step-1 gradients.
"""

from __future__ import annotations

import time

import torch

from mgpu.models import resnet18
from mgpu.check.tolerance import FLOOR_ULPS, error
from mgpu.check.model.check import CheckOptions, References, run_in_process
from mgpu.check.model.compare import EPS32
from mgpu.check.model.probe import switch_off_dropout
from mgpu.check.model.record import RunPlan
from mgpu.spec import builtin_spec, image_spec


def ratios(spec, seed: int, n: int, plan: RunPlan, options: CheckOptions) -> list[tuple]:
    model = spec.build_seeded(seed)
    switch_off_dropout(model)
    refs = References(spec, model, options)
    rec = run_in_process(spec, model, "manual", n, plan, options)
    out = []
    for s in range(1, plan.steps + 1):
        state, opt = rec.states[s - 1][0], rec.optimizer_states[s - 1]
        r64, r32 = (refs.step(state, opt, plan, s, n, dtype) for dtype in (torch.float64, torch.float32))
        pairs = [(rec.states[s][0], r64.state, r32.state, "")]
        if s == 1:
            pairs.append((rec.grads[0], r64.grads, r32.grads, "gradient "))
        for got, want, single, prefix in pairs:
            for name, ref in want.items():
                if ref is None or not ref.is_floating_point():
                    continue
                floor = FLOOR_ULPS * EPS32 * float(ref.abs().max())
                ratio = error(got[name], ref)[0] / max(error(single[name], ref)[0], floor, 1e-300)
                out.append((ratio, spec.name, seed, n, plan.batch_size, s, prefix + name))
    return out


def main() -> None:
    torch.set_num_threads(1)
    options = CheckOptions()
    specs = [builtin_spec("lenet"), builtin_spec("resnet18", width=8),
             image_spec(lambda: resnet18(10, 1, 4), (1, 28, 28), 10, name="resnet18 width 4, default init"),
             image_spec(lambda: resnet18(10, 1, 8), (1, 28, 28), 10, name="resnet18 width 8, default init")]
    try:
        import torchvision

        specs.append(image_spec(lambda: torchvision.models.resnet18(num_classes=10), (3, 32, 32), 10,
                                name="torchvision resnet18"))
    except ImportError:
        pass
    start = time.perf_counter()
    for spec in specs:
        found = []
        for seed in range(5):
            for n in (2, 3):
                for batch in (12, 13):
                    found += ratios(spec, seed, n, RunPlan(batch, 3, seed), options)
        values = torch.tensor([r[0] for r in found])
        print(f"{spec.name}: {len(found)} tensor-steps; ratio median {float(values.median()):.2f}, "
              f"99th percentile {float(values.quantile(0.99)):.2f}, max {float(values.max()):.2f} "
              "(%s seed %d, %d devices, batch %d, step %d, %s)" % max(found)[1:])
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
