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


@pytest.mark.multiprocess
@pytest.mark.rounding  # an exact accuracy from two ranks against one device's: rerun under other kernels
def test_ddp_evaluates_with_rank_0s_buffers_after_a_skipped_last_step(monkeypatch):
    """A NaN input on rank 1 at the epoch's last step: the step is skipped everywhere, but rank 1's
    BatchNorm statistics took the NaN in its forward. DDP copies rank 0's buffers only at the next
    forward or optimizer step, neither of which comes before evaluation; evaluation must still use
    rank 0's, as model.pt holds them, so the run's test accuracy is model.pt's on one device."""
    from correctness.helpers import evaluate
    from mgpu.data import make_loaders
    from mgpu.devices import devices
    from mgpu.models import build_model
    from mgpu.strategies import SingleDevice

    cfg = TrainConfig(strategy="ddp", devices=2, model="resnet18", width=4, epochs=1, batch_size=32, train_size=128,
                      test_size=64, out=None, progress=False, on_nonfinite="skip", lr=0.05)
    monkeypatch.setenv(FAULT_ENV, "kind=nan,rank=1,epoch=1,step=4")  # 128 / 32: the last step
    result = train(cfg)
    assert result.epochs[0].skipped_steps == 1, result.epochs
    assert all(torch.isfinite(t).all() for t in result.state_dict.values()), "model.pt holds rank 0's finite state"
    model = build_model("resnet18", width=4)
    model.load_state_dict(result.state_dict)
    _, test_loader = make_loaders(cfg)
    expected = evaluate(SingleDevice(devices(1)), model, test_loader)
    assert result.epochs[0].test_acc == expected, (
        f"ddp on 2 ranks reported test accuracy {result.epochs[0].test_acc} after a skipped last step, but model.pt "
        f"gives {expected} on one device: a rank evaluated with buffers other than rank 0's")
