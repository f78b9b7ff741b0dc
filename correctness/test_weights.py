"""Property 2: after k >= 3 SGD steps with momentum and weight decay, on data reshuffled between
steps, the weights of single, manual (2 and 3 emulated devices), DDP and FSDP (2 and 3 gloo processes)
and, on 2+ GPUs, DataParallel agree within float32 tolerance.

The runs go through `mgpu.run.train`, the code behind `python -m mgpu train`. Batches of 25 over
2 and 3 devices make uneven shards (13 + 12, 9 + 8 + 8): averaging per-shard mean losses, or DDP
averaging gradients without scaling each rank's loss by its share, would show up here.
LeNet, not ResNet-18: with BatchNorm in training mode multi-device weights legitimately differ
(test_batchnorm.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import requires_gpus
from correctness.draws import batch_sizes_for, seeds, training_steps
from correctness.helpers import assert_every_parameter_changed, assert_tensors_close, run_config, weights_config
from mgpu.models import build_model
from mgpu.run import train


def initial_weights(cfg) -> dict:
    return build_model(cfg.model, width=cfg.width, seed=cfg.seed).state_dict()


def check_against_single(state_dict: dict, single: dict, what: str) -> None:
    cfg = weights_config("single")
    where = f"{what} vs single device after {cfg.epochs} steps (batch {cfg.batch_size}, seed {cfg.seed})"
    assert_tensors_close(state_dict, single, where=where)
    assert_every_parameter_changed(state_dict, initial_weights(cfg), where=what)


@pytest.mark.parametrize("n", [2, 3])
def test_manual_weights_match_single_device_after_k_steps(n, single_device_weights):
    check_against_single(train(weights_config("manual", n)).state_dict, single_device_weights,
                         f"manual over {n} emulated devices")


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_rank_strategies_weights_match_single_device_after_k_steps(strategy, world_size, rank_runs,
                                                                   single_device_weights):
    """ddp, and fsdp (whose model.pt is the full state gathered from the shards), on 2 and 3 ranks."""
    check_against_single(rank_runs(world_size).weights[strategy].state_dict, single_device_weights,
                         f"{strategy} rank 0 of {world_size} gloo processes")


@requires_gpus(2)
def test_dataparallel_weights_match_single_device_on_gpus(single_device_weights):
    cfg = weights_config("dataparallel", 2)
    cfg.require_gpus = True
    check_against_single(train(cfg).state_dict, single_device_weights, "dataparallel over 2 GPUs")


@settings(max_examples=10)
@given(n=st.sampled_from([2, 3]), data=st.data(), steps=training_steps, seed=seeds)
def test_manual_weights_match_single_device_for_any_batch_steps_and_seed(n, data, steps, seed):
    batch_size = data.draw(batch_sizes_for(n, max_batch=32), label="batch_size")
    # One step per epoch, each on a different reshuffled subset of the training set.
    settings_ = dict(model="lenet", epochs=steps, batch_size=batch_size, train_size=batch_size + batch_size // 2,
                     test_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, seed=seed % 2**16)
    single = train(run_config("single", **settings_)).state_dict
    manual = train(run_config("manual", n, **settings_)).state_dict
    assert_tensors_close(manual, single, where=f"manual over {n} devices vs single after {steps} steps "
                                               f"(batch {batch_size}, seed {settings_['seed']})")
    assert_every_parameter_changed(manual, build_model("lenet", seed=settings_["seed"]).state_dict(),
                                   where=f"manual over {n} devices")
