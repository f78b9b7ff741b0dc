"""Property 2: step by step over several SGD steps with momentum and weight decay (4 in the suite's
shared runs, helpers.weights_config; 2 or 3 in the drawn ones), on data reshuffled
between steps, manual (2 and 3 emulated devices), DDP and FSDP (2 and 3 processes) and, on 2+ GPUs,
DataParallel compute what single-device training computes, within float32 tolerance.

Every step of the checked run starts from the single-device state after the step before (weights,
momentum buffers: helpers.stepwise_configs, through the run's own checkpoint and --resume), so
rounding cannot pile up over steps: a free-running comparison after many steps is one CPU kernel
change from red (a ReLU flipped by rounding moved LeNet 4e-3 in 25 steps), while a step that
starts from the right state and ends elsewhere is a bug in that step. The runs go through
`mgpu.run.train`, the code behind `python -m mgpu train`. Batches of 25 over 2 and 3 devices make
uneven shards (13 + 12, 9 + 8 + 8): averaging per-shard mean losses, or DDP averaging gradients
without scaling each rank's loss by its share, would show up here. LeNet, not ResNet-18: with
BatchNorm in training mode multi-device weights legitimately differ (test_batchnorm.py).
"""

from __future__ import annotations

import dataclasses
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import requires_gpus
from correctness.draws import batch_sizes_for, seeds, training_steps
from correctness.helpers import (assert_every_parameter_changed, assert_stepwise_close, reference_trajectory,
                                 run_config, stepwise_configs, weights_config)
from mgpu.models import build_model
from mgpu.run import train


pytestmark = pytest.mark.rounding  # the rounding-sensitive part: make test runs it under other CPU kernels too

def initial_weights(cfg) -> dict:
    return build_model(cfg.model, width=cfg.width, seed=cfg.seed).state_dict()


def check_against_single(results: list, reference, what: str) -> None:
    assert_stepwise_close(results, reference, what)
    assert_every_parameter_changed(results[-1].state_dict, initial_weights(reference.cfg), where=what)


@pytest.mark.parametrize("n", [2, 3])
def test_manual_weights_match_single_device_step_by_step(n, single_trajectory, tmp_path):
    results = [train(cfg) for cfg in stepwise_configs(single_trajectory, "manual", n, tmp_path)]
    check_against_single(results, single_trajectory, f"manual over {n} devices ({results[0].devices})")


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_strategies_weights_match_single_device_step_by_step(strategy, world_size, rank_runs, single_trajectory):
    """ddp, and fsdp (whose model.pt is the full state gathered from the shards), on 2 and 3 ranks."""
    results = rank_runs(world_size).stepwise[strategy]
    check_against_single(results, single_trajectory, f"{strategy} rank 0 of {world_size} ({results[0].devices})")


@requires_gpus(2)
def test_dataparallel_weights_match_single_device_on_gpus(tmp_path):
    reference = reference_trajectory(dataclasses.replace(weights_config("single"), device="cuda"), tmp_path / "reference")
    results = [train(cfg) for cfg in stepwise_configs(reference, "dataparallel", 2, tmp_path)]
    check_against_single(results, reference, "dataparallel over 2 GPUs")


@settings(max_examples=10)
@given(n=st.sampled_from([2, 3]), data=st.data(), steps=training_steps, seed=seeds)
def test_manual_weights_match_single_device_step_by_step_for_any_batch_steps_and_seed(n, data, steps, seed):
    batch_size = data.draw(batch_sizes_for(n, max_batch=32), label="batch_size")
    # One step per epoch, each on a different reshuffled subset of the training set.
    cfg = run_config("single", model="lenet", epochs=steps, batch_size=batch_size,
                     train_size=batch_size + batch_size // 2, test_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3,
                     seed=seed % 2**16)
    with tempfile.TemporaryDirectory() as folder:  # the float64 steps read the reference's checkpoints
        reference = reference_trajectory(cfg, f"{folder}/reference")
        results = [train(c) for c in stepwise_configs(reference, "manual", n, folder)]
        check_against_single(results, reference, f"manual over {n} devices, {steps} steps of batch {batch_size}")
