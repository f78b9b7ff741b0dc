"""The A/B gate's benchmark set, defined once: which perf benchmarks the gate times, and each one's
workload spec (what a worker of either arm builds: mgpu_perf/harness/workloads.py `make_gated`).

    >>> [name for name, _ in gated_set(make_sweep(None))]    # on a 2-core CPU without GPUs
    ['test_train_step[single]', 'test_train_step[manual]', ..., 'test_matmul_one_device[synchronised]']

perf/test_training.py and perf/test_kernels.py mark these benchmarks (`pytest.mark.mgpu_gate(spec)`); the gate sizes
Holm's levels by the tests it collects, and `python -m mgpu_perf validate-gate` and the gate's tests by
`len(gated_set(sweep))`. A benchmark added to the gate is added here, nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgpu.strategies import RANK_STRATEGIES

# The training workloads at a size whose A/B pairs fit the gate's 5-minute budget on a 2-core CPU
# (width 16: about 1/16 of the full network's work); on GPUs the full network at the GPU batch.
GATE_CPU = dict(width=16, batch=32)
GATE_GPU = dict(width=64, batch=128)
# The kernel workload: the notebook's products, synchronised, on the first device.
MATMUL_CPU = dict(size=384, products=20)
MATMUL_GPU = dict(size=4000, products=50)


@dataclass(frozen=True)
class Case:
    strategy: str
    devices: int


def gated_steps(top: int) -> list[Case]:
    """The training steps gated: single, manual at the most devices, ddp at 1 and the most ranks,
    fsdp at the most ranks (`top`: the sweep's largest device count)."""
    cases = [Case("single", 1), Case("manual", top), Case("ddp", 1), Case("ddp", top), Case("fsdp", top)]
    return list(dict.fromkeys(cases))  # ddp at 1 and at `top` are one case when top is 1


GATED_EPOCHS = (Case("single", 1),)


def train_spec(kind: str, case: Case, sweep) -> dict:
    """The workload spec of a training benchmark (`train-step` or `train-epoch`)."""
    size = GATE_GPU if sweep.gpus else GATE_CPU
    return dict(kind=kind, strategy=case.strategy, devices=case.devices, threads_per_device=sweep.threads_per_device,
                steps_per_epoch=3, **size)


def matmul_spec(gpus: int) -> dict:
    size = MATMUL_GPU if gpus else MATMUL_CPU
    return dict(kind="matmul", **size, threads=None if gpus else 1, device="cuda:0" if gpus else "cpu")


def is_gated(kind: str, case: Case, sweep) -> bool:
    cases = gated_steps(sweep.max_count) if kind == "train-step" else GATED_EPOCHS if kind == "train-epoch" else ()
    return case in cases


def case_id(case: Case, sweep) -> str:
    """The training benchmarks' test id of a case: `single-1cpu`, `manual-2dev-emulated`, `ddp-2ranks-cpu`, `ddp-2gpu`."""
    return f"{case.strategy}-{sweep.label(case.devices, 'ranks' if case.strategy in RANK_STRATEGIES else 'dev')}"


def gated_set(sweep) -> list[tuple[str, dict]]:
    """(benchmark, workload spec) of every gated benchmark, in the suite's order."""
    steps = [(f"test_train_step[{case_id(c, sweep)}]", train_spec("train-step", c, sweep))
             for c in gated_steps(sweep.max_count)]
    epochs = [(f"test_train_epoch[{case_id(c, sweep)}]", train_spec("train-epoch", c, sweep)) for c in GATED_EPOCHS]
    return steps + epochs + [("test_matmul_one_device[synchronised]", matmul_spec(sweep.gpus))]
