"""A NaN or Inf loss stops training at that step, naming epoch and step; --on-nonfinite skip skips it.

The NaN is injected with the MGPU_FAULT test hook (kind=nan makes one step's input NaN), or
comes from a learning rate large enough to diverge.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from mgpu.cli import main
from mgpu.config import TrainConfig
from mgpu.errors import NonFiniteLossError
from mgpu.faults import FAULT_ENV
from mgpu.run import train


pytestmark = pytest.mark.reliability

TINY = dict(model="lenet", epochs=2, batch_size=32, train_size=128, test_size=32, out=None, progress=False)


@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2)])
def test_nan_loss_stops_training_naming_epoch_and_step(strategy, n, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "kind=nan,epoch=2,step=3")
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 2, step 3: training stopped") as info:
        train(TrainConfig(strategy=strategy, devices=n, **TINY))
    assert isinstance(info.value, FloatingPointError)


def test_skip_policy_skips_the_step_and_counts_it(monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "kind=nan,epoch=1,step=2")
    result = train(TrainConfig(on_nonfinite="skip", **TINY))
    assert [e.skipped_steps for e in result.epochs] == [1, 0]
    assert all(torch.isfinite(t).all() for t in result.state_dict.values()), "a skipped step must not touch weights"
    assert math.isfinite(result.epochs[0].loss)


def test_diverging_learning_rate_is_caught_not_trained_on():
    with pytest.raises(NonFiniteLossError, match=r"loss is (nan|inf) at epoch \d+, step \d+"):
        train(TrainConfig(strategy="manual", devices=2, lr=1e12, **{**TINY, "epochs": 3}))


def test_cli_nonfinite_loss_is_one_line_and_exit_code_1(monkeypatch, capsys):
    monkeypatch.setenv(FAULT_ENV, "kind=nan,epoch=1,step=2")
    code = main(["train", "--model", "lenet", "--epochs", "1", "--batch-size", "32", "--train-size", "64",
                 "--test-size", "32", "--no-progress", "--out", ""])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(f"mgpu: {FAULT_ENV}")]
    assert code == 1, err
    assert len(err) == 1 and re.match(r"mgpu: error: loss is nan at epoch 1, step 2", err[0]), err
