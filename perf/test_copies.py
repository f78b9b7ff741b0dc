"""Copies, the notebook's second experiment: the products' results from the GPU to the host,
a blocking copy into new (pageable) memory against `non_blocking=True` into pinned memory.

    pytest perf/test_copies.py          # needs a CUDA device; skipped (with the reason) otherwise

There is no CPU variant: without a GPU "device to host" is a copy within host memory, and pinned
memory needs CUDA, so it would measure nothing the experiment is about. Both variants synchronise
inside the timed function, so each round is the whole copy. The notebook copies 50 results of
4000 x 4000; 10 (640 MB) keep the pinned host buffers modest at the same bandwidth.
"""

from __future__ import annotations

import pytest
import torch

from conftest import requires_gpus
from mgpu_perf.sweep import record_rate

SIZE, RESULTS, ROUNDS, WARMUP_ROUNDS = 4000, 10, 10, 2


@pytest.fixture(scope="module")
def results_on_gpu():
    x = torch.rand(SIZE, SIZE, generator=torch.Generator().manual_seed(0)).to("cuda:0")
    ys = [x.mm(x) for _ in range(RESULTS)]
    torch.cuda.synchronize()
    return ys


def _check_and_report(benchmark, host, device, pinned):
    for h, d in zip((host[0], host[-1]), (device[0], device[-1])):
        assert torch.equal(h, d.cpu()), "the host copy differs from the device tensor"
    nbytes = sum(t.numel() * t.element_size() for t in device)
    benchmark.extra_info.update(bytes=nbytes, tensors=len(device), pinned=pinned, device=str(device[0].device))
    record_rate(benchmark, nbytes / 1e9, "GB/s")


@requires_gpus(1)
@pytest.mark.benchmark(group="copies-device-to-host")
def test_copy_blocking_pageable(benchmark, results_on_gpu):
    host = []

    def run():
        host[:] = [y.to("cpu") for y in results_on_gpu]  # each copy returns when done

    benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    _check_and_report(benchmark, host, results_on_gpu, pinned=False)


@requires_gpus(1)
@pytest.mark.benchmark(group="copies-device-to-host")
def test_copy_non_blocking_pinned(benchmark, results_on_gpu):
    host = [torch.empty(y.shape, dtype=y.dtype, pin_memory=True) for y in results_on_gpu]

    def run():
        for h, y in zip(host, results_on_gpu):
            h.copy_(y, non_blocking=True)  # queued; the copies stream back while the next is queued
        torch.cuda.synchronize()  # in the timed function: the round ends when the data is on the host

    def clear_first():  # so a round that copied nothing cannot pass the check below; returns None:
        host[0].zero_()  # pytest-benchmark reads a setup's return value as the round's arguments

    benchmark.pedantic(run, setup=clear_first, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    _check_and_report(benchmark, host, results_on_gpu, pinned=True)
