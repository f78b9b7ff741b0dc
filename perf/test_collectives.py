"""Collectives: mgpu's `split_batch`, `allreduce` and `ring_allreduce` over the device list, and
`torch.distributed.all_reduce` (gloo on CPUs, nccl on GPUs), over message sizes doubling from
4 KiB to 32 MiB.

    pytest perf/test_collectives.py
    pytest perf/test_collectives.py -k "dist and 32MiB"

extra_info holds the message bytes, algbw (bytes / time) and busbw as nccl-tests defines it:
algbw x 2(n-1)/n for an allreduce, x (n-1)/n for a scatter (split_batch), so busbw compares with
the link speed whatever n is. It also holds the wrong elements over every checked call (must be 0).
Every allreduce round starts from fresh per-device contributions (copied in an untimed setup)
so the sum can be checked exactly; the check runs after the round, untimed.

On a CPU the devices are emulated: split_batch's `.to("cpu")` returns views (nothing moves: that
row measures the call's overhead), and allreduce adds in memory. torch.distributed.all_reduce runs
between this process (rank 0) and helper processes started once per device count.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from mgpu_perf.harness.peers import CollectivePeers, allreduce_pattern
from mgpu.comm import allreduce, ring_allreduce, split_batch
from mgpu.devices import devices as get_devices
from mgpu.devices import synchronize
from mgpu_perf.sweep import SWEEP_KEY

SIZES = [4096 * 2**k for k in range(14)]  # 4 KiB .. 32 MiB of float32
ROUND_BUDGET_S = 0.1  # timed time per benchmark; small messages get more rounds, up to MAX_ROUNDS
MIN_ROUNDS, MAX_ROUNDS, WARMUP_ROUNDS = 10, 200, 3
SPLIT_COLUMNS = 64  # split_batch: a (bytes / 256) x 64 float32 batch, at least 16 rows


def size_id(nbytes: int) -> str:
    return f"{nbytes // 2**20}MiB" if nbytes >= 2**20 else f"{nbytes // 2**10}KiB"


def pytest_generate_tests(metafunc):
    if "n_devices" in metafunc.fixturenames:
        s = metafunc.config.stash[SWEEP_KEY]
        counts = s.collective_counts()
        metafunc.parametrize("n_devices", counts, ids=[s.label(n, unit="ranks" if "peers" in metafunc.fixturenames
                                                                else "dev") for n in counts], scope="module")
    if "nbytes" in metafunc.fixturenames:
        metafunc.parametrize("nbytes", SIZES, ids=[size_id(b) for b in SIZES])


def rounds_for(one_call_s: float) -> int:
    return max(MIN_ROUNDS, min(MAX_ROUNDS, int(ROUND_BUDGET_S / max(one_call_s, 1e-7))))


def timed_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def report(benchmark, op, n, devs_label, emulated, nbytes, bus_factor, wrong):
    benchmark.extra_info.update(op=op, devices=n, device_label=devs_label, emulated=emulated, bytes=nbytes,
                                wrong_elements=wrong, busbw_factor=round(bus_factor, 4))
    if benchmark.stats is not None:
        algbw = nbytes / benchmark.stats.stats.median / 1e9
        benchmark.extra_info["algbw_GBps"] = round(algbw, 4)
        benchmark.extra_info["busbw_GBps"] = round(algbw * bus_factor, 4)
    assert wrong == 0, f"{op}: {wrong} wrong elements"


@pytest.fixture(scope="module")
def devs(n_devices):
    return get_devices(n_devices)


# On a CPU, split_batch and the emulated allreduces measure microseconds of Python and memory
# traffic; between unchanged runs on a shared VM they moved by up to +60 %, all sizes together,
# so the CPU gate deselects them too (-m "not cpu_noisy"). On GPUs they are gated.
@pytest.mark.cpu_noisy
@pytest.mark.benchmark(group="collective-split_batch")
def test_split_batch(benchmark, sweep, devs, nbytes, cpu_threads):
    n = len(devs)
    X = torch.rand(nbytes // 4 // SPLIT_COLUMNS, SPLIT_COLUMNS, generator=torch.Generator().manual_seed(0))
    y = torch.arange(X.shape[0])
    shards = []

    def run():
        shards[:] = [split_batch(X, y, devs)]
        synchronize(devs)

    rounds = rounds_for(timed_once(run))
    benchmark.pedantic(run, rounds=rounds, warmup_rounds=WARMUP_ROUNDS)
    Xs, ys = shards[0]
    wrong = int((torch.cat([s.cpu() for s in Xs]) != X).sum()) + int((torch.cat([s.cpu() for s in ys]) != y).sum())
    assert [s.device for s in Xs] == list(devs)
    report(benchmark, "split_batch", n, sweep.label(n), devs.emulated, X.numel() * 4, (n - 1) / n, wrong)
    if devs[0].type == "cpu":
        benchmark.extra_info["note"] = "emulated devices: shards are views, no data moves"


@pytest.mark.cpu_noisy
@pytest.mark.benchmark(group="collective-allreduce")
@pytest.mark.parametrize("algorithm", [allreduce, ring_allreduce], ids=["allreduce", "ring_allreduce"])
def test_mgpu_allreduce(benchmark, sweep, devs, nbytes, algorithm, cpu_threads):
    n, numel = len(devs), nbytes // 4
    contributions = [allreduce_pattern(numel, i, d) for i, d in enumerate(devs)]
    expected = sum(c.cpu() for c in contributions)
    tensors = [torch.empty_like(c) for c in contributions]
    wrong = [0]

    def reset():
        for t, c in zip(tensors, contributions):
            t.copy_(c)
        synchronize(devs)

    def run():
        algorithm(tensors)
        synchronize(devs)

    def check():
        wrong[0] += sum(int((t.cpu() != expected).sum()) for t in tensors)

    reset()
    rounds = rounds_for(timed_once(run))
    benchmark.pedantic(run, setup=reset, teardown=check, rounds=rounds, warmup_rounds=WARMUP_ROUNDS)
    check()  # the last call (the only one when benchmarks are disabled: then no teardown runs)
    report(benchmark, algorithm.__name__, n, sweep.label(n), devs.emulated, nbytes, 2 * (n - 1) / n, wrong[0])


@pytest.fixture(scope="module")
def peers(sweep, n_devices):
    """This process and n-1 helpers in one process group, for the whole module (starting them costs seconds)."""
    group = CollectivePeers(n_devices, "nccl" if sweep.on_gpu(n_devices) else "gloo")
    yield group
    group.close()


# Over gloo on a CPU, a call's time is mostly how soon the peer process wakes up: medians of two
# unchanged runs differ by 20-40 %, so the CPU gate deselects it (-m "not cpu_noisy").
@pytest.mark.cpu_noisy
@pytest.mark.multiprocess
@pytest.mark.benchmark(group="collective-dist_all_reduce")
def test_dist_all_reduce(benchmark, sweep, peers, n_devices, nbytes, cpu_threads):
    n = n_devices
    t = peers.begin(nbytes // 4)
    calls, wrong = [0], [0]

    def run():
        dist.all_reduce(t)
        if t.is_cuda:
            torch.cuda.synchronize()
        calls[0] += 1

    def check():
        wrong[0] += peers.wrong(t)

    peers.reset(t)
    rounds = rounds_for(timed_once(run))
    benchmark.pedantic(run, setup=lambda: peers.reset(t), teardown=check, rounds=rounds, warmup_rounds=WARMUP_ROUNDS)
    wrong[0] += peers.end(t, calls[0])  # one more call, checked on every rank, ends the helpers' loop
    report(benchmark, f"torch.distributed.all_reduce ({peers.backend})", n, sweep.label(n, unit="ranks"),
           not sweep.on_gpu(n), nbytes, 2 * (n - 1) / n, wrong[0])
