"""Every strategy trains, and the CLI runs the whole job end to end for each."""

from __future__ import annotations

import pytest
import torch

from mgpu.cli import main
from mgpu.config import TrainConfig
from correctness.helpers import TINY, assert_trained, check_run_outputs
from mgpu.run import train


# DDP: test_reliability_ranks.py::test_python_dash_m_mgpu_train_ddp_end_to_end, on these settings (TINY),
# reads the reference run that module starts anyway: one DDP run less.
@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2), ("manual", 3), ("dataparallel", 2)])
def test_each_strategy_reduces_the_loss(strategy, n):
    result = train(TrainConfig(strategy=strategy, devices=n, **TINY))
    assert_trained([e.loss for e in result.epochs], result.test_acc, result.state_dict, result.summary_line(),
                    f"{strategy} on {n} devices")


def test_a_batch_that_does_not_divide_evenly_still_trains():
    # 10 examples a step over 3 devices: shards of 4, 3, 3.
    result = train(TrainConfig(strategy="manual", devices=3, **{**TINY, "batch_size": 10, "train_size": 100}))
    assert result.epochs[-1].loss < result.epochs[0].loss


def test_dataparallel_on_the_cpu_says_it_is_a_pass_through(capsys):
    # --device cpu: the CPU beside GPUs too, where nn.DataParallel would otherwise scatter over them.
    result = train(TrainConfig(strategy="dataparallel", devices=2, device="cpu", **{**TINY, "epochs": 1}))
    out = capsys.readouterr().out
    assert "pass-through" in out and "not on 2 devices" in out, out
    assert result.devices == "[device(type='cpu')]", "a pass-through must not claim 2 devices"


@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2), ("dataparallel", 2)])
def test_cli_writes_the_line_the_json_and_the_plot(tmp_path, capsys, strategy, n):
    out = tmp_path / strategy
    code = main(["train", "--strategy", strategy, "--devices", str(n), "--model", "lenet", "--epochs", "2",
                 "--batch-size", "64", "--lr", "0.3", "--train-size", "256", "--test-size", "100",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    check_run_outputs(out, capsys.readouterr().out, strategy, epochs=2)
