"""Checkpoint and resume: a run interrupted mid-epoch and resumed ends bitwise where an
uninterrupted run ends; checkpoints are written atomically; a bad one is an error, never a fresh start.

These run in this process (single, manual): the interruption is the MGPU_FAULT hook raising in
the middle of an epoch, which leaves the checkpoint directory exactly as a kill would (nothing
is written between epochs). ddp and fsdp resume in the suite's shared ranks (conftest's rank_runs);
fsdp with a real SIGKILL, from the command line, in test_reliability_ranks.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from correctness.helpers import COMPARISON_KIND, assert_tensors_close
from mgpu import checkpoint
from mgpu.config import TrainConfig
from mgpu.errors import CheckpointError, OutputDirError
from mgpu.faults import FAULT_ENV
from mgpu.run import train


pytestmark = pytest.mark.reliability

# Momentum, so that the optimizer state matters; 4 steps an epoch.
TINY = dict(model="lenet", epochs=3, batch_size=32, lr=0.05, momentum=0.9, train_size=128, test_size=32,
            out=None, progress=False, device=COMPARISON_KIND)


@pytest.fixture(scope="module")
def reference():
    """Uninterrupted runs, one per strategy."""
    return {name: train(TrainConfig(strategy=name, devices=n, **TINY)) for name, n in (("single", 1), ("manual", 2))}


def _assert_bitwise_equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{what}: tensors differ: {differ}"


def _interrupt(cfg: TrainConfig, monkeypatch, epoch: int = 2, step: int = 3) -> None:
    monkeypatch.setenv(FAULT_ENV, f"kind=raise,epoch={epoch},step={step}")
    with pytest.raises(RuntimeError, match="injected fault"):
        train(cfg)
    monkeypatch.delenv(FAULT_ENV)


@pytest.mark.parametrize("strategy, n", [
    ("single", 1),
    ("manual", 2),
])
def test_resume_after_interruption_is_bitwise_exact(strategy, n, reference, tmp_path, monkeypatch, capsys):
    cfg = TrainConfig(strategy=strategy, devices=n, checkpoint_dir=str(tmp_path), **TINY)
    _interrupt(cfg, monkeypatch)
    assert checkpoint.load(tmp_path)["epoch"] == 1, "only the epoch before the interruption is saved"
    capsys.readouterr()
    resumed = train(TrainConfig(strategy=strategy, devices=n, checkpoint_dir=str(tmp_path), resume=True, **TINY))
    out = capsys.readouterr().out
    assert f"resuming from {tmp_path / checkpoint.CHECKPOINT_NAME} after epoch 1 (2 epoch(s) left)" in out, out
    assert [e.epoch for e in resumed.epochs] == [1, 2, 3], "the result covers every epoch, saved ones included"
    ref = reference[strategy]
    _assert_bitwise_equal(ref.state_dict, resumed.state_dict, f"{strategy}: resumed vs uninterrupted weights")
    assert [e.loss for e in resumed.epochs] == [e.loss for e in ref.epochs]
    assert checkpoint.load(tmp_path)["epoch"] == 3


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_rank_strategies_resume_after_interruption_is_bitwise_exact(strategy, rank_runs):
    """ddp and fsdp on 2 gloo ranks (the suite's shared ranks: helpers.InterruptedJob), stopped after
    epoch 1 and resumed, end bitwise where the uninterrupted run ends (fsdp with a real SIGKILL in
    epoch 2, from the command line: test_reliability_ranks)."""
    runs = rank_runs(2)
    resumed, uninterrupted = runs.resumed[strategy], runs.weights[strategy]
    assert [e.epoch for e in resumed.epochs] == [e.epoch for e in uninterrupted.epochs]
    _assert_bitwise_equal(uninterrupted.state_dict, resumed.state_dict,
                          f"{strategy} on 2 ranks: resumed vs uninterrupted weights")


def test_checkpoint_holds_everything_to_resume(reference, tmp_path):
    train(TrainConfig(checkpoint_dir=str(tmp_path), **{**TINY, "epochs": 1}))
    ckpt = checkpoint.load(tmp_path)
    assert ckpt["epoch"] == 1 and len(ckpt["history"]) == 1
    assert set(ckpt["model"]) == set(reference["single"].state_dict)
    assert ckpt["optimizer"]["state"], "momentum buffers must be saved"
    assert {"torch", "python"} <= set(ckpt["rng"])
    assert ckpt["fingerprint"] == checkpoint.fingerprint(TrainConfig(**TINY))
    assert sorted(os.listdir(tmp_path)) == [checkpoint.CHECKPOINT_NAME], "no temporary file may be left"


def test_resume_without_a_checkpoint_starts_afresh_and_says_so(reference, tmp_path, capsys):
    result = train(TrainConfig(checkpoint_dir=str(tmp_path / "new"), resume=True, **TINY))
    assert f"no checkpoint in {tmp_path / 'new'}: starting from epoch 1" in capsys.readouterr().out
    _assert_bitwise_equal(reference["single"].state_dict, result.state_dict, "fresh start vs uninterrupted")


def test_resume_may_add_epochs(reference, tmp_path, monkeypatch):
    """A run of 3 epochs, interrupted in its second, resumed with --epochs 4: bitwise the uninterrupted
    4-epoch run. A resume that restarted from scratch, skipped the added epoch or lost the momentum
    buffers ends elsewhere."""
    ckpt_dir = tmp_path / "ckpt"
    _interrupt(TrainConfig(checkpoint_dir=str(ckpt_dir), **TINY), monkeypatch)
    result = train(TrainConfig(checkpoint_dir=str(ckpt_dir), resume=True, **{**TINY, "epochs": 4}))
    assert [e.epoch for e in result.epochs] == [1, 2, 3, 4]
    assert checkpoint.load(ckpt_dir)["epoch"] == 4
    uninterrupted = train(TrainConfig(**{**TINY, "epochs": 4}))
    _assert_bitwise_equal(uninterrupted.state_dict, result.state_dict, "resumed with an epoch added vs 4 epochs")
    assert any(not torch.equal(uninterrupted.state_dict[k], v) for k, v in reference["single"].state_dict.items()), \
        "a 4th epoch left the weights as they were after 3: the comparison above shows nothing"


@pytest.mark.rounding
def test_resume_may_change_strategy(tmp_path, monkeypatch):
    """A single-device checkpoint after epoch 1 resumed on manual over 2 devices: its step (one step
    an epoch here) ends within float32 tolerance of the single-device step from that checkpoint.
    One step from a shared state, as every cross-strategy comparison of the suite is (test_weights):
    over many steps, rounding differences between strategies may flip a ReLU and compound. A resume
    that restarted from scratch or lost the momentum buffers ends elsewhere."""
    one_step = {**TINY, "train_size": 40, "epochs": 2}  # 40 examples, batches of 32: one step an epoch
    ckpt_dir, out = tmp_path / "ckpt", tmp_path / "out"
    _interrupt(TrainConfig(checkpoint_dir=str(ckpt_dir), **one_step), monkeypatch, epoch=2, step=1)
    result = train(TrainConfig(strategy="manual", devices=2, checkpoint_dir=str(ckpt_dir), resume=True,
                               **{**one_step, "out": str(out)}))
    assert [e.epoch for e in result.epochs] == [1, 2]
    uninterrupted = train(TrainConfig(**one_step))
    assert_tensors_close(result.state_dict, uninterrupted.state_dict,
                         where="step 1 single, step 2 resumed on manual over 2 devices, vs 2 steps single")
    assert_tensors_close(torch.load(out / "model.pt"), result.state_dict, exact=True,
                         where="model.pt of the resumed run vs its RunResult.state_dict")
    fresh = train(TrainConfig(strategy="manual", devices=2, **{**one_step, "epochs": 1}))
    assert any(not torch.equal(fresh.state_dict[k], v) for k, v in result.state_dict.items()), \
        "resumed and fresh runs agree: the comparison above cannot tell a restart from a resume"


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    train(TrainConfig(checkpoint_dir=str(tmp_path), **{**TINY, "epochs": 1}))
    before = (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes()

    def crash(src, dst):  # the process dies between writing the new file and renaming it
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OutputDirError, match="cannot write checkpoint .*No space left on device"):
        train(TrainConfig(checkpoint_dir=str(tmp_path), resume=True, **{**TINY, "epochs": 2}))
    monkeypatch.undo()
    assert (tmp_path / checkpoint.CHECKPOINT_NAME).read_bytes() == before, "the complete checkpoint was damaged"
    assert checkpoint.load(tmp_path)["epoch"] == 1  # the left-over .tmp file is ignored


@pytest.mark.parametrize("damage", ["truncated", "empty", "not-a-checkpoint"])
def test_damaged_checkpoint_is_an_error_not_a_fresh_start(damage, tmp_path):
    train(TrainConfig(checkpoint_dir=str(tmp_path), **{**TINY, "epochs": 1}))
    path = tmp_path / checkpoint.CHECKPOINT_NAME
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"weights": torch.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="truncated or corrupt|not an mgpu checkpoint"):
        train(TrainConfig(checkpoint_dir=str(tmp_path), resume=True, **TINY))


def test_checkpoint_of_another_model_is_an_error(tmp_path):
    cfg = TrainConfig(checkpoint_dir=str(tmp_path), **{**TINY, "epochs": 1})
    checkpoint.save(tmp_path, cfg=cfg, epoch=1, model_state={"0.weight": torch.zeros(1)},
                    optimizer_state={"state": {}, "param_groups": []}, history=[])
    with pytest.raises(CheckpointError, match="does not fit this model"):
        train(TrainConfig(checkpoint_dir=str(tmp_path), resume=True, **TINY))
