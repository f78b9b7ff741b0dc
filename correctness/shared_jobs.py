"""What the suite's background process (correctness/shared_runs.py) computes for two test modules,
and those modules read too: test_parity's built-in cases and their rank reports, and
test_reported_figures' timed run. Here, not in the test modules, so that the process imports no
test module and no test module is imported back by it (no import circle).

This module is imported by the background process: it must not import pytest, hypothesis, a test
module or correctness/shared_runs.py.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass

from correctness.helpers import COMPARISON_KIND, run_config
from mgpu.faults import FAULT_ENV
from mgpu.parity import CheckOptions, check_data_parallel
from mgpu.run import train
from mgpu.spec import ModelSpec, builtin_spec


# -- test_parity ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityCase:
    spec: ModelSpec
    examples: int                     # hypothesis examples of the in-process property
    world_sizes: dict                 # rank strategy -> world sizes, one spawn each; absent where the suite checks it elsewhere
    rank_steps: int = CheckOptions().steps  # steps of each rank run (the second already starts from momentum)
    max_steps: int = 3                # the most steps the in-process property draws


def builtin_cases() -> dict[str, ParityCase]:
    # mgpu's own: LeNet under ddp (one spawn; fsdp's LeNet runs are test_weights' and test_evaluation's);
    # ResNet-18 (BatchNorm) under fsdp, whose BatchNorm follows ddp's rules (ddp's are test_batchnorm's).
    # Two steps a rank run: fsdp's gathers make each step of ResNet-18 on gloo costly. At most two
    # in process too: the second step starts from momentum buffers (and accumulated micro-steps' state),
    # and a third takes its path again at the cost of another step of every run the check makes.
    return {"lenet": ParityCase(builtin_spec("lenet"), 6, {"ddp": (2,)}, rank_steps=2, max_steps=2),
            "resnet18-w4": ParityCase(builtin_spec("resnet18", width=4), 4, {"fsdp": (2,)}, rank_steps=2,
                                      max_steps=2)}


def fewest_training_examples(case: ParityCase) -> int | str:
    """The fewest examples (1 to 4) one training step of the model accepts on one device, or a text
    naming each try's error where none does."""
    model = case.spec.build_seeded(0).train()
    errors = []
    for n in (1, 2, 3, 4):
        inputs, target = case.spec.batch(n, seed=0)
        try:
            case.spec.objective.loss_and_stats(model(*inputs), target, 1.0)[0].backward()
            return n
        except Exception as e:  # noqa: BLE001 (any error of the model's own code)
            errors.append(f"{n}: {type(e).__name__}: {e}")
    return f"{case.spec.name} trains on no batch of 1 to 4 examples on one device: {errors}"


def rank_report(case: ParityCase, rank_strategy: str, fewest: int):
    """The check of `case` under `rank_strategy` on its world sizes (one spawn each), with a batch that
    gives every rank at least `fewest` examples a micro-step. For mgpu's own models the suite's
    background process makes it (correctness/shared_runs.py, `parity_job`) while the tests before
    test_parity run; a failure is then the check's error as text."""
    sizes = case.world_sizes[rank_strategy]
    batch = max(CheckOptions().batch_size, max(sizes) * CheckOptions().accumulate * fewest)
    return check_data_parallel(case.spec, strategies=(rank_strategy,), devices=sizes, batch_size=batch,
                               steps=case.rank_steps, device=COMPARISON_KIND)


def run_parity_job(test_id: str):
    """What the background process runs for test_parity's rank test with this id ("lenet-ddp"): that
    test's report for one of mgpu's own models. (A model that draws random numbers would be skipped
    by the test's own fixture before it reads the report.)"""
    for name, case in builtin_cases().items():
        for rank_strategy in case.world_sizes:
            if f"{name}-{rank_strategy}" == test_id:
                fewest = fewest_training_examples(case)
                if isinstance(fewest, str):
                    raise RuntimeError(fewest)
                return rank_report(case, rank_strategy, fewest)
    raise ValueError(f"no built-in parity case for {test_id!r}")


# -- test_reported_figures --------------------------------------------------------------------------
DELAY_MS = 500  # how long rank 1 of the DDP run sleeps in its first step (FAULT_ENV, kind=delay)

# 1024 training examples in global batches of 32 (shards of 11, 11, 10 over 3 devices), images
# resized to 10x10 to keep it cheap, momentum so that one epoch leaves the chapter's tiny initial
# weights (after fewer steps the model predicts one class for everything, whatever its BatchNorm
# statistics); 61 test examples in batches of 32, so that the last one (29) splits unevenly too.
RUN = dict(model="resnet18", width=4, resize=10, epochs=1, batch_size=32, lr=0.1, momentum=0.9, train_size=1024,
           test_size=61, seed=3)


@dataclasses.dataclass
class Run:
    result: object   # RunResult
    out: object      # the run's output folder
    wall_s: float    # wall time around train(cfg)


def timed_run(strategy: str, n: int, out) -> Run:
    """RUN under `strategy` on `n` devices, writing into `out`; under ddp, rank 1 sleeps DELAY_MS at
    the start of the epoch's first step."""
    cfg = run_config(strategy, n, out=str(out), **RUN)
    saved = os.environ.get(FAULT_ENV)
    if strategy == "ddp":
        os.environ[FAULT_ENV] = f"kind=delay,rank=1,epoch=1,step=1,ms={DELAY_MS}"
    try:
        start = time.perf_counter()
        result = train(cfg)
        return Run(result, out, time.perf_counter() - start)
    finally:
        os.environ.pop(FAULT_ENV, None)
        if saved is not None:
            os.environ[FAULT_ENV] = saved
