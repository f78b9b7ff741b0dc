"""Property 6: the same seed twice gives bitwise-equal weights, for single, manual and DDP on CPU.

The seed fixes the initial weights, the synthetic data and the batch order (mgpu/data.py), and
every CPU kernel these runs use is deterministic, so two runs must agree to the bit. Each test
also shows that its comparison can fail: another seed gives other weights.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from correctness.helpers import assert_tensors_close, weights_config
from mgpu.run import train


def assert_some_weight_differs(a: dict, b: dict, what: str) -> None:
    assert any(not torch.equal(a[k], b[k]) for k in a), f"{what}: seeds 7 and 8 gave the same weights"


@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2), ("manual", 3)])
def test_same_seed_twice_gives_bitwise_equal_weights(strategy, n):
    cfg = weights_config(strategy, n)
    first, second = train(cfg).state_dict, train(dataclasses.replace(cfg)).state_dict
    assert_tensors_close(second, first, exact=True, where=f"{strategy} over {n} device(s), seed {cfg.seed}: "
                                                           "second run vs first")
    other = train(dataclasses.replace(cfg, seed=cfg.seed + 1)).state_dict
    assert_some_weight_differs(first, other, f"{strategy} over {n} device(s)")


@pytest.mark.multiprocess
def test_ddp_same_seed_twice_gives_bitwise_equal_weights(rank_runs):
    # Both runs happen in the same two rank processes, each in a fresh process group.
    runs = rank_runs(2)
    assert_tensors_close(runs.weights_again.state_dict, runs.weights["ddp"].state_dict, exact=True,
                         where="ddp over 2 gloo processes, seed 7: second run vs first (rank 0)")
    assert_some_weight_differs(runs.weights["ddp"].state_dict, train(dataclasses.replace(weights_config("single"), seed=8)).state_dict,
                               "ddp seed 7 vs single seed 8")
