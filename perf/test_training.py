"""Training throughput: one step and one short epoch of the full-width ResNet-18, for every
strategy at every device count, with images/s, speedup and scaling efficiency against 1 device.

    pytest perf/test_training.py                      # timings; the scaling table comes at the end
    pytest perf/test_training.py -k ddp               # DDP only: 1 rank against 2 ranks
    pytest perf/test_training.py -k interleaved       # the DDP and FSDP scaling figures alone
    pytest perf --model examples/tiny_lm.py:spec      # the step benchmarks on your model (MODULE:FUNCTION)

Weak scaling: each device gets the same batch at every count, so the global batch grows with the
devices. On a CPU each emulated device (a replica for manual, a process for ddp) gets the same
threads at every count (see mgpu_perf/sweep.py), so manual's replicas take turns on those threads while
ddp's ranks run in parallel. DDP ranks start once per count (a process start costs seconds) and
run each step when the benchmark asks, so pytest-benchmark times every DDP step itself: slowest
rank, gradient allreduce and the loss allreduce included.

The DDP speedup to quote is the `interleaved` row: the same DDP ranks, one step at each rank count in
turn, so that a machine whose speed drifts between benchmarks (a shared VM) does not decide it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from mgpu.strategies import RANK_STRATEGIES
from mgpu_perf.counts.step import StepCounts, count_session
from mgpu_perf.gated import Case, case_id, is_gated, train_spec
from mgpu_perf.harness import interleave
from mgpu_perf.harness.models import ModelBench
from mgpu_perf.harness.ranks import StrategyRankPool
from mgpu_perf.harness.sessions import TrainBench, TrainSession
from mgpu_perf.sweep import SWEEP_KEY, record_rate


@dataclass(frozen=True)
class Settings:
    per_device_batch: int
    steps_per_epoch: int
    step_rounds: int
    step_warmup: int
    epoch_rounds: int
    epoch_warmup: int
    interleaved_rounds: int  # DDP scaling: steps at each rank count, taken in turn
    width: int = 64          # ResNet-18 base width (64: the full network)


# CPU: a full-width ResNet-18 step takes about 0.65 s a core at batch 32, so few rounds fit the
# 5-minute budget. Batch 32, not 16: DDP's gradient allreduce (45 MB over gloo, about 80 ms on two
# cores) would otherwise cost a quarter of a step and hide the ranks' parallel speedup.
CPU = Settings(per_device_batch=32, steps_per_epoch=2, step_rounds=8, step_warmup=2, epoch_rounds=2, epoch_warmup=1,
               interleaved_rounds=10)
GPU = Settings(per_device_batch=128, steps_per_epoch=20, step_rounds=30, step_warmup=5, epoch_rounds=5, epoch_warmup=1,
               interleaved_rounds=30)


def _cases(sweep, kind: str, model: str | None) -> list:
    def param(case: Case, marks=()):
        # Gated: mgpu's own network only (a --model run times a user's model, whose gate is docs/guide/gate.md's).
        gated = [pytest.mark.mgpu_gate(train_spec(kind, case, sweep))] if is_gated(kind, case, sweep) and not model else []
        return pytest.param(case, id=case_id(case, sweep), marks=[*marks, *gated])

    params = [param(Case("single", 1))]
    for n in sweep.counts:
        params.append(param(Case("manual", n)))
    for n in sweep.counts:
        # Without CUDA, nn.DataParallel is a pass-through on one device: more would claim what it is not.
        skip = pytest.mark.skipif(n > 1 and not sweep.on_gpu(n),
                                  reason=f"dataparallel on {n} devices needs {n} CUDA devices (found {sweep.gpus})")
        params.append(param(Case("dataparallel", n), marks=[skip]))
    for strategy in RANK_STRATEGIES:
        for n in sweep.counts:
            params.append(param(Case(strategy, n), marks=[pytest.mark.multiprocess]))
    return params


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        kind = "train-epoch" if metafunc.function.__name__ == "test_train_epoch" else "train-step"
        metafunc.parametrize("case", _cases(metafunc.config.stash[SWEEP_KEY], kind, metafunc.config.getoption("model", None)))


@pytest.fixture(scope="module")
def settings(sweep, pytestconfig) -> Settings:
    chosen = GPU if sweep.gpus else CPU
    if pytestconfig.getoption("benchmark_disable"):
        # A smoke run checks that every benchmark works, not its time: one step an epoch, a narrow network.
        chosen = replace(chosen, steps_per_epoch=1, width=16)
    return chosen


@pytest.fixture(scope="module")
def model_name(pytestconfig, settings) -> str:
    return pytestconfig.getoption("model", None) or f"resnet18 width {settings.width}"


@pytest.fixture(scope="module")
def sessions(sweep, settings, pytestconfig):
    """One set-up strategy per case, shared by its step and epoch benchmarks; DDP ranks stay up
    (idle, blocked on their queue) until the module ends. With --model, sessions of that model."""
    cache = {}
    model = pytestconfig.getoption("model", None)

    def get(case: Case):
        if case not in cache:
            if model:
                bench = ModelBench(model, case.strategy, case.devices, per_device_batch=settings.per_device_batch,
                                   input_shape=pytestconfig.getoption("input_shape", None),
                                   classes=pytestconfig.getoption("classes", None), threads_per_device=sweep.threads_per_device)
            else:
                bench = TrainBench(case.strategy, case.devices, per_device_batch=settings.per_device_batch,
                                   width=settings.width, steps_per_epoch=settings.steps_per_epoch,
                                   threads_per_device=sweep.threads_per_device)
            cache[case] = StrategyRankPool(bench) if case.strategy in RANK_STRATEGIES else bench.open()
        return cache[case]

    yield get
    for session in cache.values():
        session.close()


def _report(benchmark, case, sweep, settings, scaling_rows, measure: str, images: int, model: str) -> None:
    n = case.devices
    benchmark.extra_info.update(
        strategy=case.strategy, devices=n, device_label=sweep.label(n, unit="ranks" if case.strategy in RANK_STRATEGIES else "dev"),
        emulated=sweep.emulated(n), scaling="weak (fixed per-device batch)", model=model,
        per_device_batch=settings.per_device_batch, global_batch=settings.per_device_batch * n,
        threads_per_device=sweep.threads_per_device, images_per_round=images)
    rate = record_rate(benchmark, images, "images/s", per_device=n)
    base = next((r for r in scaling_rows if r["devices"] == 1 and r["strategy"] == case.strategy
                 and r["measure"] == measure and r["images_per_s"]), None)
    if rate and base:
        speedup, efficiency = interleave.speedups(rate, base["images_per_s"], n)
        benchmark.extra_info["speedup"], benchmark.extra_info["efficiency"] = round(speedup, 3), round(efficiency, 3)
        # From the fastest rounds: what the code can do when nothing else runs on the machine.
        fastest, _ = interleave.speedups(n / benchmark.stats.stats.min, 1 / base["min_s"], n)
        benchmark.extra_info["speedup (fastest rounds)"] = round(fastest, 3)
    stats = benchmark.stats.stats if benchmark.stats else None
    scaling_rows.append(_scaling_row(case.strategy, measure, n, benchmark.extra_info["device_label"], sweep, settings,
                                     rate, stats.median if stats else None, stats.min if stats else None))


def _scaling_row(strategy, measure, n, label, sweep, settings, images_per_s, median_s, min_s) -> dict:
    """One row of the scaling table (mgpu_perf/scaling.py fills in speedup and efficiency)."""
    return {"strategy": strategy, "measure": measure, "devices": n, "label": label, "emulated": sweep.emulated(n),
            "images_per_s": images_per_s, "per_device_batch": settings.per_device_batch,
            "median_s": median_s, "min_s": min_s}


@pytest.mark.benchmark(group="train-step")
def test_train_step(benchmark, case, sessions, sweep, settings, scaling_rows, cpu_threads, model_name):
    session = sessions(case)
    losses = []
    benchmark.pedantic(lambda: losses.append(session.step()), rounds=settings.step_rounds,
                       warmup_rounds=settings.step_warmup)
    assert losses and all(math.isfinite(v) for v in losses), f"non-finite loss: {losses}"
    assert session.weights_moved() > 0, "the steps did not change the weights"
    # Parameters, gradients and optimizer state a device holds (an fsdp rank: its shards); CUDA: the peak.
    benchmark.extra_info["memory_per_device"] = session.memory_bytes()
    # What the step does, counted (mgpu_perf/counts/step.py): one more step, outside the timing, per rank.
    counts = [StepCounts.from_dict(c) for c in count_session(session, session.step)]
    assert counts and all(c.flops > 0 and c.allocated_bytes > 0 for c in counts), [c.summary() for c in counts]
    if case.strategy in RANK_STRATEGIES and case.devices > 1:
        assert all(c.collective_calls > 0 for c in counts), f"{case.strategy} ranks that do not communicate: " \
                                                             f"{[c.summary() for c in counts]}"
    benchmark.extra_info["counted_step"] = [c.figures() for c in counts]
    _report(benchmark, case, sweep, settings, scaling_rows, "step", settings.per_device_batch * case.devices, model_name)


@pytest.mark.benchmark(group="train-epoch")
def test_train_epoch(benchmark, case, sessions, sweep, settings, scaling_rows, cpu_threads, model_name):
    session = sessions(case)
    epochs = []
    benchmark.pedantic(lambda: epochs.append(session.epoch()), rounds=settings.epoch_rounds,
                       warmup_rounds=settings.epoch_warmup)
    assert all(math.isfinite(e.loss) for e in epochs), f"non-finite epoch loss: {epochs}"
    assert session.weights_moved() > 0, "the epoch did not change the weights"
    # The timed epoch is training plus evaluation of one test batch; the trainer's own figure is training only.
    benchmark.extra_info["train_only_images/s (trainer)"] = round(epochs[-1].images_per_sec, 3)
    _report(benchmark, case, sweep, settings, scaling_rows, "epoch",
            settings.per_device_batch * case.devices * settings.steps_per_epoch, model_name)


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", RANK_STRATEGIES)
def test_rank_scaling_interleaved(strategy, sessions, sweep, settings, scaling_rows, pytestconfig):
    """ddp (and fsdp) speedup over 1 rank with the steps of every rank count interleaved (the figure to quote).

    The ddp and fsdp rows of test_train_step come from benchmarks run one after another; on a machine
    whose speed drifts, a slow minute during one of them moves the speedup by 10 % or more.
    Here every round steps each count once, so drift slows all counts alike.
    """
    counts = list(sweep.counts)
    if len(counts) < 2:
        pytest.skip(f"needs at least 2 device counts to compare (sweep: {counts})")
    disabled = pytestconfig.getoption("benchmark_disable")
    pools = {n: sessions(Case(strategy, n)) for n in counts}
    times = interleave.interleaved_step_times(pools, rounds=1 if disabled else settings.interleaved_rounds,
                                          warmup=0 if disabled else 1)  # checks losses and weight updates
    rows = interleave.scaling_rows(times, settings.per_device_batch)
    assert [r["ranks"] for r in rows] == counts and all(r["images_per_s"] > 0 for r in rows), f"bad rows: {rows}"
    if disabled:
        return  # one untimed round: the machinery works, the figure means nothing
    for row in rows:
        n = row["ranks"]
        scaling_rows.append(_scaling_row(strategy, "interleaved", n, sweep.label(n, unit="ranks"), sweep, settings,
                                         row["images_per_s"], row["step_s_median"], row["step_s_min"]))


@pytest.mark.benchmark(group="train-step-options")
@pytest.mark.parametrize("option", ["amp-bf16", "channels-last"])
def test_train_step_option(benchmark, option, sweep, settings, cpu_threads):
    """The single-device step with a speed option GPU users turn on (--amp bf16, --channels-last);
    compare with test_train_step[single-...] (figures: docs/notes/perf.md)."""
    bench = TrainBench("single", 1, per_device_batch=settings.per_device_batch, width=settings.width,
                       steps_per_epoch=settings.steps_per_epoch, threads_per_device=sweep.threads_per_device,
                       amp="bf16" if option == "amp-bf16" else "off", channels_last=option == "channels-last")
    session = TrainSession(bench)
    try:
        losses = []
        benchmark.pedantic(lambda: losses.append(session.step()), rounds=settings.step_rounds,
                           warmup_rounds=settings.step_warmup)
        assert losses and all(math.isfinite(v) for v in losses), f"non-finite loss with {option}: {losses}"
        assert session.weights_moved() > 0, f"the steps with {option} did not change the weights"
    finally:
        session.close()
    benchmark.extra_info.update(option=option, model=f"resnet18 width {settings.width}",
                                per_device_batch=settings.per_device_batch)
    record_rate(benchmark, settings.per_device_batch, "images/s", per_device=1)
