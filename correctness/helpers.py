"""Shared pieces of the correctness suite: models and batches, reference gradients, comparisons
that say where and by how much two results differ, and the few DDP and FSDP runs the suite shares.

Starting ranks costs seconds, so every multi-process check of the suite rides on one spawned run
per world size (`spawn_rank_runs`: ddp's and fsdp's training and evaluation, one after the other in
the same ranks), made once per test session for the session fixture `rank_runs`
(correctness/conftest.py; in the background while the tests before them run:
correctness/shared_runs.py) and shared by test_weights, test_determinism, test_evaluation,
test_memory and the reliability tests.

This module is imported by the spawned ranks too: it must not import hypothesis or the root
conftest.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from mgpu import devices as devmod
from mgpu.config import TrainConfig
from mgpu.data import BatchLoader, ImageDataset
from mgpu.launch import free_port, spawn
from mgpu.models import build_model, lenet, resnet18
from mgpu.check.model.compare import assert_tensors_close  # noqa: F401  (one copy: the check's)
from mgpu.check.tolerance import error as core_error
from mgpu.strategies import RANK_STRATEGIES, DistributedDataParallel, Manual, get_strategy

# A DDP run of the suite gets this long on a machine no busier than its cores (load_stretched: more on a busier
# one) before spawn() stops every rank and names the stragglers.
DDP_DEADLINE_S = 120.0
# A test of the suite's ResNet-18 uses this width: the same architecture, (64/4)^2 = 256 times fewer multiply-adds.
RESNET_WIDTH = 4


def load_stretched(seconds: float) -> float:
    """`seconds` on a machine whose load is at most its cores, stretched by load / cores on a busier one (at most
    10 x): a time limit for work that load slows (a CI runner's other jobs, a burner), not a fixed guess."""
    import os

    from mgpu.devices import usable_cores

    return seconds * min(10.0, max(1.0, os.getloadavg()[0] / max(1, len(usable_cores()))))
# The most devices (or ranks) a comparison of the suite's training runs uses (manual over 3, ddp and fsdp on 3).
MOST_DEVICES = 3
# One device kind for every comparison of training runs, the one-device reference included: the GPUs when
# there are MOST_DEVICES of them, else the CPU for all (a GPU reference against emulated CPU devices would
# compare two kinds of hardware). The root conftest prints it in the header.
COMPARISON_KIND = devmod.comparison_kind(MOST_DEVICES, devmod.gpu_count())


# -- models and data ---------------------------------------------------------------------------
def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference, in float64 (the check core's error function, NaN equal to NaN)."""
    return core_error(a.double(), b.double())[0]


def make_model(name: str, seed: int) -> nn.Module:
    """LeNet, or a width-4 ResNet-18 with PyTorch's default initialisation (gradients of a useful
    size, unlike the chapter's N(0, 0.01^2), which makes them so small that any tolerance passes)
    and random BatchNorm running statistics, so that eval mode is not the identity."""
    torch.manual_seed(seed)
    if name == "lenet":
        return lenet()
    if name == "resnet18":
        model = resnet18(num_classes=10, in_channels=1, width=RESNET_WIDTH)
        g = torch.Generator().manual_seed(seed)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
        return model
    raise ValueError(name)


def random_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, y) shaped like Fashion-MNIST: (B, 1, 28, 28) in [0, 1], labels 0..9."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch_size, 1, 28, 28, generator=g), torch.randint(0, 10, (batch_size,), generator=g)


def sgd(lr: float = 0.1, momentum: float = 0.0, weight_decay: float = 0.0) -> Callable[[list], torch.optim.Optimizer]:
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def run_config(strategy: str, devices: int = 1, **overrides) -> TrainConfig:
    """A TrainConfig for tests: nothing written, no progress bar, on the suite's COMPARISON_KIND."""
    settings = dict(strategy=strategy, devices=devices, out=None, progress=False,
                    device="cuda" if overrides.get("require_gpus") else COMPARISON_KIND)
    settings.update(overrides)
    return TrainConfig(**settings)


def weights_config(strategy: str, devices: int = 1) -> TrainConfig:
    """The run whose final weights single, manual, DDP (and DataParallel on GPUs) must agree on.

    4 SGD steps with momentum and weight decay: 40 training examples and global batches of 25
    (drop_last), so every epoch is one step on a different reshuffled subset, and 25 splits
    unevenly over 2 (13 + 12) and 3 (9 + 8 + 8) devices.
    """
    return run_config(strategy, devices, model="lenet", epochs=4, batch_size=25, train_size=40, test_size=30,
                      lr=0.05, momentum=0.9, weight_decay=1e-3, seed=7)


# -- step by step from a shared state ------------------------------------------------------------
# Runs of different strategies, thread counts or CPU kernels round differently, and over many steps
# one rounding difference can flip a ReLU and move the weights far past float32 tolerance (LeNet
# moved 4e-3 in 25 steps when only the CPU kernels changed). So runs are compared one step at a
# time: every step of the checked run starts from the reference's state after the step before,
# through the run's own checkpoint and --resume (weights, momentum buffers, RNG states). Its end
# is judged as `mgpu check` judges a step (mgpu.check.model.compare): against the same step in float64
# from the same state, allowing the check core's FACTOR times the float32 reference's own distance from it.
# A fixed float32 tolerance is not enough for one step either: a ReLU that rounding flips inside the
# step moves a correct run past torch's atol (docs/notes/kernel-timings.md has the case).
# weights_config takes one step an epoch, so epoch e is step e.

@dataclass
class Trajectory:
    """The single-device reference of `cfg`, step by step: the checkpoint folder after each step and
    the weights after each step (both indexed from step 1). `yardsticks` keeps what
    assert_stepwise_close derives from the reference alone, step by step (StepYardstick), so that
    the session's trajectory, against which six runs are judged, computes it once."""
    cfg: TrainConfig
    folders: list
    weights: list
    yardsticks: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def steps(self) -> int:
        return len(self.weights)


def reference_trajectory(cfg: TrainConfig, root) -> Trajectory:
    """Training of `cfg` (single-device, as a rule), one epoch (= one step) a run, each resumed from
    the last one's checkpoint: bitwise what one uninterrupted run computes (test_reliability_checkpoint)."""
    from mgpu.run import train

    root, folders, weights = Path(root), [], []
    for step in range(1, cfg.epochs + 1):
        folder = root / f"single-step{step}"
        if folders:
            shutil.copytree(folders[-1], folder)
        result = train(dataclasses.replace(cfg, epochs=step, checkpoint_dir=str(folder), resume=step > 1))
        folders.append(folder)
        weights.append(result.state_dict)
    return Trajectory(cfg, folders, weights)


def stepwise_configs(reference: Trajectory, strategy: str, devices: int, root, **overrides) -> list[TrainConfig]:
    """One config a step of `reference`: step s under `strategy` on `devices` (and `overrides`, such
    as channels_last=True), resumed from a copy of the reference's checkpoint after step s - 1
    (step 1: the seeded start every strategy shares)."""
    configs = []
    for step in range(1, reference.steps() + 1):
        folder = Path(root) / f"{strategy}{devices}-{len(overrides)}-step{step}"
        if step > 1:
            shutil.copytree(reference.folders[step - 2], folder)
        configs.append(dataclasses.replace(reference.cfg, strategy=strategy, devices=devices, epochs=step,
                                           checkpoint_dir=str(folder) if step > 1 else None, resume=step > 1,
                                           **overrides))
    return configs


def saved_before(reference: Trajectory, step: int) -> dict | None:
    """The reference's checkpoint after step - 1 (None for step 1: the seeded start)."""
    from mgpu import checkpoint

    if step == 1:
        return None
    saved = checkpoint.load(reference.folders[step - 2])
    assert saved is not None, f"no checkpoint in {reference.folders[step - 2]}: was its folder removed?"
    return saved


def float64_step(reference: Trajectory, step: int, train_loader, dtype: torch.dtype = torch.float64,
                 shards: int = 1, saved: dict | None = None) -> dict:
    """The reference's step `step` in float64 (or `dtype`) on the CPU: from its float32 state after
    step - 1 (the checkpoint: weights and momentum buffers, cast), on the same global batch (the
    training set's batch order of that epoch), SGD with the run's settings on the mean cross-entropy,
    summed over `shards` contiguous shards of the batch as data parallelism sums it. LeNet-like
    models only (no buffers written in forward). `train_loader`: make_loaders(reference.cfg)'s;
    `saved`: saved_before(reference, step), when the caller has it already (it is read otherwise)."""
    from mgpu.comm import shard_bounds

    cfg = reference.cfg
    model = build_model(cfg.model, width=cfg.width, seed=cfg.seed)
    if saved is None:
        saved = saved_before(reference, step)
    if saved is not None:
        model.load_state_dict(saved["model"])
    model = model.to(dtype).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if saved is not None:
        # Floating-point state is cast to the parameters' dtype; at float32 the cast is no copy and
        # step() would update the caller's momentum buffers in place: the optimizer gets a copy.
        optimizer.load_state_dict(copy.deepcopy(saved["optimizer"]))
    train_loader.set_epoch(step - 1)
    indices = next(iter(train_loader.index_batches()))
    X, y = train_loader.dataset.take(indices)
    X = X.to(dtype)
    for start, stop in (shard_bounds(len(y), shards, i) for i in range(shards)):
        (F.cross_entropy(model(X[start:stop]), y[start:stop], reduction="sum") / len(y)).backward()
    optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


# The float32 steps whose distance from the float64 step sizes what a run may differ by: the single
# run's own, and the same step summed over 2 and 3 shards. One float32 run's error on one tensor is
# one draw: on a conv bias (a sum over thousands of positions that cancel) it was once 26 times
# smaller than that of the same sum taken over two shards, and a correct manual run failed.
YARDSTICK_SHARDS = (2, 3)


@dataclass(frozen=True)
class StepYardstick:
    """What a run's step `step` is judged against (assert_stepwise_close): the float64 step from the
    reference's state and, per tensor, the float32 step farthest from it."""
    exact: dict
    widest: dict


def step_yardstick(reference: Trajectory, step: int, what: str) -> tuple[dict, dict]:
    """(exact, widest) of the reference's step `step`, computed on first use and kept in
    reference.yardsticks: they depend on the reference alone, not on the run judged."""
    if step not in reference.yardsticks:
        reference.yardsticks[step] = _step_yardstick(reference, step, what)
    kept = reference.yardsticks[step]
    return kept.exact, kept.widest


def _step_yardstick(reference: Trajectory, step: int, what: str) -> StepYardstick:
    from mgpu.data import make_loaders
    from mgpu.check.model.compare import error

    cfg, single32 = reference.cfg, reference.weights[step - 1]
    train_loader, _ = make_loaders(cfg)
    saved = saved_before(reference, step)  # read once for the three steps below
    exact = float64_step(reference, step, train_loader, saved=saved)
    # The float64 step must be the reference's step (the same batch and settings), or every allowance
    # would be a whole update wide. Its float32 run is then near it: within rounding, or a little off
    # where a ReLU flips within the step (docs/notes/kernel-timings.md), not a whole update away.
    before = reference.weights[step - 2] if step > 1 else build_model(cfg.model, width=cfg.width, seed=cfg.seed).state_dict()
    floats = [k for k, v in exact.items() if v.is_floating_point()]
    off = max(error(single32[k], exact[k])[0] for k in floats)
    change = max(float((exact[k] - before[k].double()).abs().max()) for k in floats)
    assert off < 0.25 * change, (f"{what}: the float64 step {step} is not the reference's step: the float32 "
                                 f"reference is {off:.3g} from it, the step changes the weights by {change:.3g}")
    # Per tensor, the float32 step farthest from the float64 one (YARDSTICK_SHARDS says why).
    yardsticks = [single32] + [float64_step(reference, step, train_loader, torch.float32, shards, saved=saved)
                               for shards in YARDSTICK_SHARDS]
    widest = {k: max(yardsticks, key=lambda y: error(y[k], exact[k])[0] if k in y else 0.0).get(k)
              for k in exact}
    return StepYardstick(exact, widest)


def assert_stepwise_close(results: list, reference: Trajectory, what: str) -> None:
    """Each step's weights (RunResults of stepwise_configs) as close to the float64 step from the
    reference's state as float32 steps from that state allow (mgpu.check.model.compare): the reference's
    own, or the same step summed over shards (YARDSTICK_SHARDS), whichever is farther."""
    from mgpu.check.model.compare import compare_to_reference

    assert len(results) == reference.steps(), f"{what}: {len(results)} steps run, {reference.steps()} expected"
    cfg = reference.cfg
    for step, result in enumerate(results, start=1):
        exact, widest = step_yardstick(reference, step, what)
        divergence = compare_to_reference(result.state_dict, exact, widest, step, 0,
                                          against=f"the float64 step from {cfg.strategy}'s state after step {step - 1}")
        assert divergence is None, (
            f"{what} vs {cfg.strategy} on {cfg.devices}, step {step} of {cfg.epochs} started from the reference's "
            f"state (batch {cfg.batch_size}, seed {cfg.seed}): {divergence.describe()}")


def labelled_by(model: nn.Module, images: torch.Tensor, seed: int, wrong_fraction: float = 0.4) -> torch.Tensor:
    """Labels on which `model` is right exactly where a seeded mask says so: an accuracy strictly
    between 0 and 1 that a miscounting evaluation cannot hit by accident."""
    with torch.no_grad():
        predictions = model(images).argmax(dim=1)
    g = torch.Generator().manual_seed(seed)
    wrong = torch.rand(len(images), generator=g) < wrong_fraction
    return torch.where(wrong, (predictions + 1) % 10, predictions)


# -- gradients ---------------------------------------------------------------------------------
def reference_gradients(model: nn.Module, X: torch.Tensor, y: torch.Tensor, reduction: str,
                        device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Gradients of the whole batch's loss on one device, computed with plain PyTorch."""
    model = copy.deepcopy(model).to(device)
    F.cross_entropy(model(X.to(device)), y.to(device), reduction=reduction).backward()
    return {name: p.grad.detach().cpu() for name, p in model.named_parameters()}


def manual_gradients(model: nn.Module, X: torch.Tensor, y: torch.Tensor, n: int,
                     reduction: str, devices: list | None = None) -> tuple[Manual, list[dict[str, torch.Tensor]]]:
    """The manual strategy over n devices (default: devmod.devices(n), real GPUs where there are
    enough) after one forward/backward and the gradient allreduce: (strategy, gradients of every replica).

    The strategy backpropagates summed losses and divides the allreduced sum by the divisor it is
    handed as the global batch size: B gives the gradient of the mean loss, 1 that of the sum.
    """
    strategy = Manual(devices if devices is not None else devmod.devices(n))
    strategy.setup(model, sgd())
    strategy.forward_backward(X, y, X.shape[0] if reduction == "mean" else 1)  # allreduces the gradients too
    return strategy, [{name: p.grad.detach().cpu() for name, p in r.named_parameters()} for r in strategy.replicas]


# -- comparisons that say what, where and by how much ------------------------------------------
def assert_every_parameter_changed(final: dict, initial: dict, where: str) -> None:
    """Negative control: a comparison of weights proves nothing if training never moved them."""
    for name, value in initial.items():
        if value.is_floating_point() and not name.endswith(("running_mean", "running_var")):
            assert not torch.equal(final[name].cpu(), value.cpu()), \
                f"{where}: {name} never changed from its initial value: the run did not train"


# -- evaluation --------------------------------------------------------------------------------
@dataclass
class EvalCase:
    images: torch.Tensor  # (N, 1, 28, 28) float
    labels: torch.Tensor  # (N,)
    batch_size: int

    def loader(self) -> BatchLoader:
        return BatchLoader(ImageDataset(self.images, self.labels), self.batch_size)

    def describe(self) -> str:
        n, b = len(self.labels), self.batch_size
        return f"{n} test examples in batches of {b} (last batch {n - (len(self.loader()) - 1) * b})"


def evaluate(strategy, model: nn.Module, loader: BatchLoader) -> float:
    """Accuracy as a training run measures it: the Trainer's evaluate over the strategy's devices."""
    from mgpu.trainer import LoopSettings, Trainer

    strategy.setup(copy.deepcopy(model), sgd())
    return Trainer(strategy, loader, loader, LoopSettings(epochs=0, progress=False), log=lambda _: None).evaluate(loader)


# -- DDP runs, shared by the suite -------------------------------------------------------------
# Every job in the ranks starts a process group of its own, on a port rank 0 picks free just
# before it binds it (`RankPorts`): a port picked when the job was made, seconds earlier, could be
# taken meanwhile by another suite running beside this one (seen: EADDRINUSE with two suites at once).

@dataclass
class TrainJob:
    """`mgpu.run.train(cfg)` inside the ranks: the code path of `python -m mgpu train --strategy ddp`."""
    cfg: TrainConfig

    def run(self, new_group: Callable[[str], None]):
        from mgpu.run import train

        return train(self.cfg)


@dataclass
class InterruptedJob:
    """`mgpu.run.train(cfg)` with a checkpoint folder, stopped after its first epoch (a run of one
    epoch: its folder is what a kill anywhere in epoch 2 leaves, nothing being written between
    epochs), then resumed from it in the same ranks for all of cfg's epochs; returns the resumed result."""
    cfg: TrainConfig

    def run(self, new_group: Callable[[str], None]):
        from mgpu.run import train

        train(dataclasses.replace(self.cfg, epochs=1))
        new_group("resume")  # a store of its own, as every job's
        return train(dataclasses.replace(self.cfg, resume=True))


@dataclass
class EvalJob:
    """Trainer.evaluate under ddp (or fsdp) for fixed LeNet weights, over several test sets."""
    state_dict: dict
    cases: list
    strategy: str = "ddp"

    def run(self, new_group: Callable[[str], None]) -> list[float]:
        cfg = run_config(self.strategy, int(os.environ["WORLD_SIZE"]))
        model = lenet()
        model.load_state_dict(self.state_dict)
        strategy = get_strategy(self.strategy).create(cfg.devices, cfg.strategy_settings())
        try:
            return [evaluate(strategy, model, case.loader()) for case in self.cases]
        finally:
            strategy.teardown()


class RankPorts:
    """The ports of the jobs' process groups, agreed on through the launcher's store (the elastic
    agent's, at the MASTER_PORT a rank starts with): rank 0 picks a free port just before its group
    binds it and publishes it; the other ranks read it and wait until it listens."""

    def __init__(self):
        from datetime import timedelta

        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                   timeout=timedelta(seconds=DDP_DEADLINE_S))

    def use(self, key: str) -> None:
        """MASTER_PORT for the next process group: a store of its own, hosted by rank 0."""
        name = f"mgpu-test/port/{key}"
        if self.rank == 0:
            port = free_port()
            self.agent.set(name, str(port))
        else:
            port = int(self.agent.get(name).decode())
        # Under torch's elastic agent (mgpu.launch) ranks would otherwise look for the agent's store there.
        os.environ.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False")
        if self.rank != 0:
            _wait_until_listening(port)


def run_jobs_in_rank(jobs: list) -> list:
    """What each rank runs: the jobs in order, each in its own process group (its own port)."""
    devmod.set_exact_gpu_math()  # for the rank's life: ranks don't get the fixture
    ports, results = RankPorts(), []
    for i, job in enumerate(jobs):
        ports.use(str(i))
        results.append(job.run(lambda key, i=i: ports.use(f"{i}/{key}")))
    return results


def _wait_until_listening(port: int, timeout_s: float = DDP_DEADLINE_S) -> None:
    """Rank 0 ends a job later than the others (it writes the checkpoint): a rank that reaches the
    next job's store first and finds nothing listening backs off (torch's TCPStore client), every
    job. Polling every 5 ms instead cuts that wait; the store itself is unchanged."""
    import socket
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            socket.create_connection((os.environ.get("MASTER_ADDR", "127.0.0.1"), port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.005)


def run_job_in_this_process(job):
    """A world of one rank in the test process itself (no spawn); the environment is restored."""
    saved_env = dict(os.environ)

    def new_group(_key: str = "") -> None:
        os.environ.update(MASTER_PORT=str(free_port()), TORCHELASTIC_USE_AGENT_STORE="False")

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    new_group()
    try:
        with devmod.torch_threads():  # the ddp strategy sets its own count
            return job.run(new_group)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)


def eval_cases(seed: int = 11) -> tuple[dict, list[EvalCase]]:
    """LeNet weights and test sets whose last batch is smaller than 2 and 3 devices, or empty for some."""
    model = make_model("lenet", seed)
    cases = []
    for i, (n, b) in enumerate([(9, 4), (10, 4), (7, 7), (41, 8), (2, 5)]):
        images, _ = random_batch(n, seed + i)
        cases.append(EvalCase(images, labelled_by(model, images, seed + i), b))
    return model.state_dict(), cases


@dataclass
class RankRuns:
    world_size: int
    stepwise: dict               # strategy (ddp, fsdp) -> [RunResult] of stepwise_configs(the single-device trajectory)
    weights: dict                # strategy (ddp, fsdp) -> RunResult of weights_config(strategy, world_size), uninterrupted
    weights_again: object        # the ddp run repeated (world size 2 only), for determinism
    accuracies: dict             # strategy -> evaluate() of eval_cases() under it
    resumed: dict                # strategy -> RunResult of weights_config interrupted and resumed (world size 2 only)


def spawn_rank_runs(world_size: int, reference: Trajectory, root) -> RankRuns:
    """The suite's ddp and fsdp runs with `world_size` ranks (gloo on the CPU, or nccl on the GPUs:
    COMPARISON_KIND), in one spawn: each step of `reference` (the single-device trajectory), the
    uninterrupted run, evaluations, and (2 ranks) a repeat and an interrupted run. Tests get them
    through the session fixture `rank_runs` (correctness/conftest.py), which spawns each world
    size once."""
    state_dict, cases = eval_cases()
    import tempfile

    stepwise = {s: stepwise_configs(reference, s, world_size, root) for s in RANK_STRATEGIES}
    steps = [TrainJob(cfg) for s in RANK_STRATEGIES for cfg in stepwise[s]]
    jobs = [TrainJob(weights_config(s, world_size)) for s in RANK_STRATEGIES]
    jobs += [EvalJob(state_dict, cases, s) for s in RANK_STRATEGIES]
    if world_size == 2:
        jobs.append(TrainJob(weights_config("ddp", world_size)))
        jobs += [InterruptedJob(dataclasses.replace(weights_config(s, world_size), checkpoint_dir=tempfile.mkdtemp()))
                 for s in RANK_STRATEGIES]
    results = spawn(run_jobs_in_rank, steps + jobs, nprocs=world_size, deadline_s=load_stretched(DDP_DEADLINE_S))
    by_step, results = results[:len(steps)], results[len(steps):]
    k, n = len(RANK_STRATEGIES), reference.steps()
    return RankRuns(world_size, {s: by_step[i * n:(i + 1) * n] for i, s in enumerate(RANK_STRATEGIES)},
                    dict(zip(RANK_STRATEGIES, results[:k])), results[2 * k] if world_size == 2 else None,
                    dict(zip(RANK_STRATEGIES, results[k:2 * k])),
                    dict(zip(RANK_STRATEGIES, results[2 * k + 1:])) if world_size == 2 else {})


def syncbn_gradients_in_rank(args) -> dict:
    """In each of 2+ GPU ranks: DDP with SyncBatchNorm, one backward of the rank's shard of (X, y);
    returns rank 0's (allreduced) gradients on the CPU."""
    model_state, X, y = args
    devmod.set_exact_gpu_math()  # for the rank's life: ranks don't get the fixture
    cfg = run_config("ddp", int(os.environ["WORLD_SIZE"]), model="resnet18", width=RESNET_WIDTH, sync_bn=True,
                     require_gpus=True)
    strategy = DistributedDataParallel.create(cfg.devices, cfg.strategy_settings())
    try:
        model = resnet18(num_classes=10, in_channels=1, width=RESNET_WIDTH)
        model.load_state_dict(model_state)
        strategy.setup(model, sgd())
        X_local, y_local = X[strategy.local_indices(torch.arange(len(y)))], y[strategy.local_indices(torch.arange(len(y)))]
        strategy.forward_backward(X_local, y_local, len(y))
        return {name: p.grad.detach().cpu() for name, p in strategy.model.named_parameters()}
    finally:
        strategy.teardown()


# ==============================================================================================
# -- IDX files: Fashion-MNIST's format, for the data tests (test_data, test_reliability_bad_input)
# ==============================================================================================
def write_idx(path, array: torch.Tensor, compress: bool = False, magic: int | None = None):
    """An IDX file as the official Fashion-MNIST ones are: a big-endian magic number (2051 for
    (N, H, W) images, 2049 for (N,) labels; `magic` overrides it), the dimensions, then the
    uint8 payload. compress=True writes PATH.gz instead of PATH. Returns the path written."""
    import gzip
    import struct
    from pathlib import Path

    if magic is None:
        magic = 2051 if array.ndim == 3 else 2049
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + array.to(torch.uint8).numpy().tobytes()
    path = Path(path)
    if compress:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)
    return path


# -- what a training run wrote -----------------------------------------------------------------
SUMMARY = re.compile(r"^test acc: \d\.\d\d, \d+\.\d sec/epoch on \[.+\]$")
# A run small enough for every strategy to learn in two epochs (LeNet beats chance clearly).
TINY = dict(model="lenet", epochs=2, batch_size=32, lr=0.3, train_size=512, test_size=200, out=None, progress=False)


def assert_trained(losses: list[float], test_acc: float, state_dict: dict, summary: str, what: str) -> None:
    """The loss fell from the first epoch to the last, the model beats chance, the weights moved."""
    assert losses[-1] < losses[0], f"{what}: loss went {losses[0]:.4f} -> {losses[-1]:.4f}"
    assert test_acc > 0.3, f"{what}: test acc {test_acc:.3f} after {len(losses)} epochs (chance: 0.1)"
    initial = build_model("lenet", seed=0).state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in state_dict.items()), f"{what}: weights never changed"
    assert SUMMARY.match(summary), summary


def check_run_outputs(out_dir, stdout: str, strategy: str, epochs: int) -> dict:
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
