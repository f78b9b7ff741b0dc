"""Every strategy trains, and the CLI runs the whole job end to end for each."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from conftest import requires_no_cuda
from mgpu.cli import main
from mgpu.config import TrainConfig
from mgpu.models import build_model
from mgpu.run import train

SUMMARY = re.compile(r"^test acc: \d\.\d\d, \d+\.\d sec/epoch on \[.+\]$")
TINY = dict(model="lenet", epochs=2, batch_size=32, lr=0.3, train_size=512, test_size=200, out=None, progress=False)


def _assert_trained(losses: list[float], test_acc: float, state_dict: dict, summary: str, what: str) -> None:
    """The loss fell from the first epoch to the last, the model beats chance, the weights moved."""
    assert losses[-1] < losses[0], f"{what}: loss went {losses[0]:.4f} -> {losses[-1]:.4f}"
    assert test_acc > 0.3, f"{what}: test acc {test_acc:.3f} after {len(losses)} epochs (chance: 0.1)"
    initial = build_model("lenet", seed=0).state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in state_dict.items()), f"{what}: weights never changed"
    assert SUMMARY.match(summary), summary


# DDP is checked by test_python_dash_m_mgpu_runs_ddp_end_to_end, on the same settings: one spawn less.
@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2), ("manual", 3), ("dataparallel", 2)])
def test_each_strategy_reduces_the_loss(strategy, n):
    result = train(TrainConfig(strategy=strategy, devices=n, **TINY))
    _assert_trained([e.loss for e in result.epochs], result.test_acc, result.state_dict, result.summary_line(),
                    f"{strategy} on {n} devices")


def test_a_batch_that_does_not_divide_evenly_still_trains():
    # 10 examples a step over 3 devices: shards of 4, 3, 3.
    result = train(TrainConfig(strategy="manual", devices=3, **{**TINY, "batch_size": 10, "train_size": 100}))
    assert result.epochs[-1].loss < result.epochs[0].loss


@requires_no_cuda("the pass-through note applies to machines without CUDA")
def test_dataparallel_without_cuda_says_it_is_a_pass_through(capsys):
    result = train(TrainConfig(strategy="dataparallel", devices=2, **{**TINY, "epochs": 1}))
    out = capsys.readouterr().out
    assert "pass-through" in out and "not on 2 devices" in out, out
    assert result.devices == "[device(type='cpu')]", "a pass-through must not claim 2 devices"


def _check_outputs(out_dir, stdout: str, strategy: str, epochs: int) -> dict:
    last_line = stdout.strip().splitlines()[-1]
    assert SUMMARY.match(last_line), f"{strategy}: last line is not the chapter's: {last_line!r}"
    data = json.loads((out_dir / "results.json").read_text())
    assert data["config"]["strategy"] == strategy and len(data["epochs"]) == epochs, data
    assert data["summary"] == last_line and {"torch", "python"} <= set(data["versions"])
    assert all({"loss", "train_acc", "test_acc", "seconds"} <= set(e) for e in data["epochs"])
    assert (out_dir / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{strategy}: accuracy.png is no PNG"
    state = torch.load(out_dir / "model.pt")
    assert all(t.device.type == "cpu" for t in state.values()) and not any(k.startswith("module.") for k in state)
    return data


@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2), ("dataparallel", 2)])
def test_cli_writes_the_line_the_json_and_the_plot(tmp_path, capsys, strategy, n):
    out = tmp_path / strategy
    code = main(["train", "--strategy", strategy, "--devices", str(n), "--model", "lenet", "--epochs", "2",
                 "--batch-size", "64", "--lr", "0.3", "--train-size", "256", "--test-size", "100",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    _check_outputs(out, capsys.readouterr().out, strategy, epochs=2)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_python_dash_m_mgpu_runs_ddp_end_to_end(tmp_path):
    """The whole job as users start it, and DDP's case of test_each_strategy_reduces_the_loss (the
    same settings, TINY), read from what the run wrote."""
    out = tmp_path / "ddp"
    proc = subprocess.run(
        [sys.executable, "-m", "mgpu", "train", "--strategy", "ddp", "--devices", "2", "--model", TINY["model"],
         "--epochs", str(TINY["epochs"]), "--batch-size", str(TINY["batch_size"]), "--lr", str(TINY["lr"]),
         "--train-size", str(TINY["train_size"]), "--test-size", str(TINY["test_size"]), "--out", str(out)],
        capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    data = _check_outputs(out, proc.stdout, "ddp", epochs=TINY["epochs"])
    _assert_trained([e["loss"] for e in data["epochs"]], data["test_acc"], torch.load(out / "model.pt"),
                    data["summary"], "ddp on 2 ranks")
    assert data["devices"] == "[cpu (rank 0), cpu (rank 1)]"
    assert f"epoch 1/{TINY['epochs']}" in proc.stderr, "the progress bar goes to stderr"
    assert proc.stdout.count("test acc:") == 1, "only rank 0 prints"
