"""The figures a run reports are the figures of what it trained.

1. With BatchNorm (ResNet-18), the test accuracy a run reports (RunResult.test_acc and
   results.json) is the accuracy of the model it saves (model.pt) evaluated on one device, for
   every strategy and device count. Multi-device evaluation uses every replica's or rank's
   BatchNorm running statistics, model.pt holds the first one's: if they differ (buffers not kept
   in sync), or the evaluation ran in training mode, or skipped test examples, the two disagree.
2. The epoch time a DDP run reports (EpochStats.seconds) is the slowest rank's wall time: each
   rank's own time is reported beside it (EpochStats.rank_seconds), and the figure is their
   maximum, not their sum nor one rank's alone. Rank 1 is made slower by the MGPU_FAULT test hook
   (kind=delay), so that the ranks' times are far from zero and their sum far from their maximum.
   Every bound is one the code controls, none a wall-clock limit that a busy machine can break:
   every step ends in collectives, so each rank's own time covers the delay, and the figure
   lies within the wall time of the whole run.

3. The training accuracy a step reports (StepResult.correct) is the number of examples of the
   global batch the model predicted right before the step, recounted with plain PyTorch on the
   whole batch; an epoch's train_acc is those counts over the examples seen. A strategy that
   reported each shard's mean correctness instead of its count fails both. LeNet (no BatchNorm:
   a shard predicts as the whole batch does), labels on which it is right for a seeded part of
   the examples only, batches that do not split evenly over 2 or 3 devices.

The runs of 1 and 2 are tiny (1 epoch of 32 steps on 10x10 images, 61 test examples) and shared:
each strategy runs once per module (fixture), the DDP one with the delay, so that both properties
ride on it (made by the suite's background process as the tests before this module run:
correctness/shared_runs.py; the run itself is correctness/shared_jobs.timed_run).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from correctness.helpers import labelled_by, make_model, random_batch, run_config, sgd
from correctness.shared_jobs import DELAY_MS, RUN, Run, timed_run
from correctness.shared_runs import FIGURES_DDP_JOB
from mgpu.data import BatchLoader, ImageDataset, synthetic_fashion_mnist
from mgpu.models import build_model
from mgpu.strategies import get_strategy
from mgpu.trainer import LoopSettings, Trainer

pytestmark = pytest.mark.rounding  # the rounding-sensitive part: make test runs it under other CPU kernels too

CASES = [("single", 1), ("manual", 2), ("manual", 3), ("dataparallel", 2),
         pytest.param("ddp", 2, marks=[pytest.mark.multiprocess, pytest.mark.timeout(180)])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_runs):
    """One run per (strategy, devices), on first use; the DDP one from the suite's background
    process when it made it (correctness/shared_runs.py: it overlaps the tests before this module)."""
    done = {}

    def get(strategy: str, n: int) -> Run:
        if (strategy, n) not in done:
            if (strategy, n) == ("ddp", 2) and shared_runs is not None and FIGURES_DDP_JOB in shared_runs.jobs:
                done[strategy, n] = shared_runs.get(FIGURES_DDP_JOB)
            else:
                done[strategy, n] = timed_run(strategy, n, tmp_path_factory.mktemp(f"{strategy}{n}"))
        return done[strategy, n]

    return get


def one_device_accuracy(state_dict: dict) -> tuple[int, int, int]:
    """(correct, total, near ties) of the saved weights over the run's test set: plain PyTorch, one
    device, eval mode, the whole test set in one batch. Near ties (top two logits within 1e-4) are
    examples whose prediction float rounding of another batch split may flip: the only slack."""
    _, test_loader = synthetic_fashion_mnist(RUN["batch_size"], train_size=RUN["train_size"],
                                             test_size=RUN["test_size"], seed=RUN["seed"], resize=RUN["resize"])
    X, y = test_loader.dataset.take(torch.arange(len(test_loader.dataset)))
    model = build_model(RUN["model"], width=RUN["width"])
    model.load_state_dict(state_dict)
    with torch.no_grad():
        logits = model.eval()(X)
        with_batch_stats = copy.deepcopy(model).train()(X).argmax(1)  # a copy: this updates running stats
    top2 = logits.topk(2, dim=1).values
    near_ties = int((top2[:, 0] - top2[:, 1] < 1e-4).sum())
    # Negative controls: the comparison must be able to see other BatchNorm statistics.
    assert len(logits.argmax(1).unique()) > 1, "the model predicts one class only: the comparison would show nothing"
    assert not torch.equal(with_batch_stats, logits.argmax(1)), \
        "the BatchNorm statistics change no prediction here: the comparison would show nothing"
    return int((logits.argmax(1) == y).sum()), len(y), near_ties


@pytest.mark.parametrize("strategy, n", CASES)
def test_reported_accuracy_is_that_of_the_saved_model(strategy, n, runs):
    run = runs(strategy, n)
    saved = torch.load(run.out / "model.pt")
    reported = json.loads((run.out / "results.json").read_text())["test_acc"]
    assert reported == run.result.test_acc, f"{strategy} over {n}: results.json says {reported}, RunResult {run.result.test_acc}"
    correct, total, near_ties = one_device_accuracy(saved)
    reported_correct = round(reported * total)
    assert abs(reported_correct - correct) <= near_ties, (
        f"{strategy} over {n} device(s): the run reports test accuracy {reported:.4f} ({reported_correct}/{total}) but "
        f"its model.pt scores {correct}/{total} on one device ({near_ties} near ties): the evaluation did not use "
        "the weights and BatchNorm statistics it saved")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_ddp_epoch_time_is_the_slowest_ranks(runs):
    run = runs("ddp", 2)
    (epoch,) = run.result.epochs
    delay = DELAY_MS / 1000
    what = (f"DDP over 2 ranks, rank 1 delayed {delay:.1f} s in its first step: reported epoch time "
            f"{epoch.seconds:.3f} s, the ranks' own {[round(t, 3) for t in epoch.rank_seconds]}, wall time of the "
            f"whole run {run.wall_s:.2f} s")
    assert len(epoch.rank_seconds) == 2, f"{what}: one time per rank expected"
    assert all(t >= delay for t in epoch.rank_seconds), f"{what}: a rank's time misses the delay it waited for"
    assert epoch.seconds == max(epoch.rank_seconds), f"{what}: not the slowest rank's time"
    assert epoch.seconds <= run.wall_s, f"{what}: longer than the run itself"
    saved = json.loads((run.out / "results.json").read_text())["epochs"][0]
    assert (saved["seconds"], saved["rank_seconds"]) == (epoch.seconds, epoch.rank_seconds), \
        f"{what}: results.json says {saved['seconds']} of {saved['rank_seconds']}"


# -- 3. the training accuracy a step and an epoch report ------------------------------------------

IN_PROCESS = [("single", 1), ("manual", 2), ("manual", 3), ("dataparallel", 2)]
BATCH = 29  # 15 + 14 over 2 devices, 10 + 10 + 9 over 3


def recount(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(examples the model predicts right, near ties): plain PyTorch, the whole batch at once, in
    train mode, as a training step's forward runs. Near ties (top two logits within 1e-4) are
    examples whose prediction the float rounding of another batch split (or device) may flip."""
    with torch.no_grad():
        logits = model.train()(X.to(next(model.parameters()).device)).cpu()
    top2 = logits.topk(2, dim=1).values
    return int((logits.argmax(1) == y).sum()), int((top2[:, 0] - top2[:, 1] < 1e-4).sum())


def trainer_for(strategy_name: str, n: int, model: torch.nn.Module, images, labels, batch_size: int,
                shuffle: bool = False) -> Trainer:
    """A Trainer over (images, labels) for a strategy holding a copy of `model`, SGD with momentum."""
    cfg = run_config(strategy_name, n, model="lenet")
    strategy = get_strategy(strategy_name).create(cfg.devices, cfg.strategy_settings())
    strategy.setup(copy.deepcopy(model), sgd(lr=0.05, momentum=0.9))
    loader = BatchLoader(ImageDataset(images, labels), batch_size, shuffle=shuffle, seed=5, drop_last=True)
    return Trainer(strategy, loader, loader, LoopSettings(epochs=1, progress=False), log=lambda _: None)


@pytest.mark.parametrize("strategy, n", IN_PROCESS)
def test_a_step_reports_the_number_of_examples_it_predicted_right(strategy, n):
    model = make_model("lenet", seed=21)
    images, _ = random_batch(BATCH, seed=21)
    labels = labelled_by(model, images, seed=21)
    right, near_ties = recount(model, images, labels)
    assert 0 < right < BATCH, f"{right} of {BATCH} right: a count that is all or nothing shows little"
    result = trainer_for(strategy, n, model, images, labels, BATCH).step(torch.arange(BATCH))
    assert not result.skipped and result.examples == BATCH, result
    assert abs(result.correct - right) <= near_ties, (
        f"{strategy} over {n} device(s): the step reports {result.correct} correct of {BATCH}, a recount of the "
        f"model's predictions before the step finds {right} ({near_ties} near ties)")


@pytest.mark.parametrize("strategy, n", IN_PROCESS)
def test_an_epochs_train_acc_is_its_steps_correct_over_the_examples_seen(strategy, n):
    model = make_model("lenet", seed=22)
    images, _ = random_batch(100, seed=22)  # 3 batches of 29; the last 13 examples are dropped
    labels = labelled_by(model, images, seed=22)
    trainer = trainer_for(strategy, n, model, images, labels, BATCH, shuffle=True)
    original_step, take, main = trainer.step, trainer.train_loader.dataset.take, trainer.strategy.modules()[0]
    steps, recounts = [], []

    def recorded_step(indices, *args):
        recounts.append(recount(main, *take(indices)))  # the weights before this step
        steps.append(original_step(indices, *args))
        return steps[-1]
    trainer.step = recorded_step  # run_epoch calls self.step
    stats = trainer.run_epoch(0)
    seen = sum(r.examples for r in steps)
    assert len(steps) == 3 and seen == 3 * BATCH, steps
    assert stats.train_acc == sum(r.correct for r in steps) / seen, (stats.train_acc, steps)
    right, near_ties = sum(r for r, _ in recounts), sum(t for _, t in recounts)
    assert 0 < right < seen
    assert abs(stats.train_acc * seen - right) <= near_ties + 1e-9, (
        f"{strategy} over {n} device(s): train_acc {stats.train_acc:.4f} of {seen} examples, a recount of each "
        f"step's predictions before it finds {right} right ({near_ties} near ties)")
