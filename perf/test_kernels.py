"""Kernels, the notebook's first experiment: repeated matrix products, timed with and without
synchronisation, and on every device at once against one device after another.

    pytest perf/test_kernels.py

On a GPU a kernel launch returns before the kernel runs, so the unsynchronised time measures
launches only; the synchronised time is the work. Both are shown, labelled. "All devices at once"
launches the products on every device and synchronises once at the end; "one after another"
finishes each device before starting the next. Sizes: the notebook's 50 products of 4000 x 4000
on GPUs; 20 of 384 x 384 on a CPU, where each call returns only when done (both timings agree)
and emulated devices share the cores (at once = one after another).
"""

from __future__ import annotations

import pytest
import torch

from mgpu.devices import devices as get_devices
from mgpu.devices import synchronize
from mgpu_perf.gated import MATMUL_CPU, MATMUL_GPU, matmul_spec
from mgpu_perf.sweep import SWEEP_KEY, record_rate

GPU_SIZE, GPU_PRODUCTS, GPU_ROUNDS = MATMUL_GPU["size"], MATMUL_GPU["products"], 10
CPU_SIZE, CPU_PRODUCTS, CPU_ROUNDS = MATMUL_CPU["size"], MATMUL_CPU["products"], 15
WARMUP_ROUNDS = 2


def pytest_generate_tests(metafunc):
    if "all_devices" in metafunc.fixturenames:  # the most devices swept, labelled (emulated or not) in the id
        s = metafunc.config.stash[SWEEP_KEY]
        metafunc.parametrize("all_devices", [s.max_count], ids=[s.label(s.max_count)])


@pytest.fixture(scope="module")
def shape(sweep):
    return (GPU_SIZE, GPU_PRODUCTS, GPU_ROUNDS) if sweep.gpus else (CPU_SIZE, CPU_PRODUCTS, CPU_ROUNDS)


def products(x: torch.Tensor, count: int) -> list[torch.Tensor]:
    """The notebook's `run`: `count` products of x with itself, queued on x's device."""
    return [x.mm(x) for _ in range(count)]


def check_products(results: list[torch.Tensor], x: torch.Tensor) -> None:
    """The first and last products equal x @ x in float64, computed on x's device (PyTorch's
    default keeps matmul TF32 off, so float32 products agree to about 1e-6)."""
    assert len(results) > 0
    reference = x.double() @ x.double()
    for y in (results[0], results[-1]):
        torch.testing.assert_close(y.double(), reference, rtol=1e-4, atol=1e-3)


def _info(benchmark, devs, size, count, timing):
    benchmark.extra_info.update(devices=len(devs), device=str(devs[0]), emulated=devs.emulated, size=size,
                                products_per_device=count, timing=timing)
    record_rate(benchmark, 2 * size**3 * count * len(devs) / 1e9, "GFLOP/s", per_device=len(devs))


def _gate(sweep_gpus: int):
    """The A/B gate's kernel workload (mgpu_perf/gated.py): the synchronised products on the first device."""
    return pytest.mark.mgpu_gate(matmul_spec(sweep_gpus))


@pytest.mark.benchmark(group="kernels-one-device")
@pytest.mark.parametrize("synchronised", [
    pytest.param(False, id="launch-only-unsynchronised"),
    pytest.param(True, id="synchronised", marks=_gate(torch.cuda.device_count()))])
def test_matmul_one_device(benchmark, shape, synchronised, cpu_threads):
    size, count, rounds = shape
    devs = get_devices(1)
    x = torch.rand(size, size, generator=torch.Generator().manual_seed(0)).to(devs[0])
    results = []

    def run():
        results[:] = products(x, count)
        if synchronised:
            synchronize(devs)

    # setup (untimed) drains the queue, so an unsynchronised round measures its own launches only.
    benchmark.pedantic(run, setup=lambda: synchronize(devs), rounds=rounds, warmup_rounds=WARMUP_ROUNDS)
    synchronize(devs)
    check_products(results, x)
    timing = ("launches + work (synchronised)" if synchronised else
              "launches only (unsynchronised)" if devs[0].type == "cuda" else "cpu: synchronous, equals synchronised")
    _info(benchmark, devs, size, count, timing)


@pytest.mark.benchmark(group="kernels-all-devices")
@pytest.mark.parametrize("order", ["all-at-once", "one-after-another"])
def test_matmul_all_devices(benchmark, sweep, shape, order, all_devices, cpu_threads):
    size, count, rounds = shape
    n = all_devices
    devs = get_devices(n)
    base = torch.rand(size, size, generator=torch.Generator().manual_seed(0))
    xs = [base.to(d) for d in devs]
    results: list[list[torch.Tensor]] = [[] for _ in devs]

    def run():
        for i, (x, d) in enumerate(zip(xs, devs)):
            results[i] = products(x, count)
            if order == "one-after-another":
                synchronize([d])
        synchronize(devs)  # all-at-once: the one synchronisation at the end

    benchmark.pedantic(run, rounds=rounds, warmup_rounds=WARMUP_ROUNDS)
    for r, x in zip(results, xs):
        check_products(r, x)
    benchmark.extra_info["device_label"] = sweep.label(n)
    _info(benchmark, devs, size, count,
          "emulated devices share the cpu: run one after another either way" if devs.emulated else order)
