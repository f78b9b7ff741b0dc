"""`train(cfg)`: the whole job behind `python -m mgpu train`.

    >>> from mgpu.config import TrainConfig
    >>> from mgpu.run import train
    >>> result = train(TrainConfig(strategy="manual", devices=2, model="lenet", epochs=1,
    ...                            train_size=2048, test_size=512, out=None))
    >>> result.summary_line()
    'test acc: 0.93, 1.9 sec/epoch on [cpu (emulated 0), cpu (emulated 1)]'

`train` validates the settings once (`TrainConfig.validate`), makes every check of the run once, in
order, before anything starts (`check_before_launch`, mgpu/preflight.py: the model, the folders and
checkpoint, what every rank would find for itself, and what the strategy alone needs,
`Strategy.preflight`), and lets the strategy start its processes (`Strategy.launch`); in each
process it builds the strategy (from `cfg.strategy_settings()`), data, model and optimizer, resumes
from a checkpoint if asked, runs the `Trainer` (mgpu/trainer.py, with `cfg.loop_settings()`) with
its callbacks, and writes the results. It never names a strategy.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict
from typing import Callable

import torch
from tqdm import tqdm

from mgpu import checkpoint, results
from mgpu import devices as devmod
from mgpu.config import EXACT_GPU_MATH_ENV, TrainConfig
from mgpu.data import BatchLoader, check_data_fits, make_loaders
from mgpu.errors import CheckpointError, ConfigError
from mgpu.faults import FAULT_ENV, Fault
from mgpu.preflight import check_before_launch
from mgpu.results import EpochStats, RunResult
from mgpu.spec import builtin_spec
from mgpu.strategies import Strategy, get_strategy
from mgpu.trainer import Callback, Trainer

__all__ = ["train", "make_optimizer_factory", "CheckpointSaver"]


def make_optimizer_factory(cfg: TrainConfig) -> Callable[[list], torch.optim.Optimizer]:
    """The same SGD for every strategy and every replica."""
    return lambda params: torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


class CheckpointSaver(Callback):
    """Writes a checkpoint after every epoch (rank 0 only; every rank holds the same weights)."""

    def __init__(self, cfg: TrainConfig, done: list[EpochStats]):
        self.cfg, self.history = cfg, list(done)

    def on_epoch_end(self, trainer: Trainer, epoch: int, stats: EpochStats) -> None:
        self.history.append(stats)
        s = trainer.strategy
        # On every rank: under fsdp, gathering the full state is a collective (rank 0 gets it).
        model_state, optimizer_state = s.model_state_dict(), s.optimizer_state_dict()
        if s.is_main:
            checkpoint.save(self.cfg.checkpoint_dir, cfg=self.cfg, epoch=epoch + 1, model_state=model_state,
                            optimizer_state=optimizer_state, history=[asdict(e) for e in self.history])
        # Every rank waits until rank 0's checkpoint is on disk: a rank that went on into the next epoch and
        # failed there would otherwise have its launcher stop rank 0 mid-save, and a resume would find no
        # checkpoint of this epoch (seen beside load, 2026-11-28). One read a checkpointed epoch.
        float(s.all_sum(torch.zeros(1, device=s.devices[0])))


def _data_on_device(loaders: tuple[BatchLoader, ...], device: torch.device) -> None:
    """--data-on-device: every dataset held on the first device once (Fashion-MNIST: 47 MB of uint8),
    checked to fit first. The batch order is still drawn on the host, so it is the same as without."""
    if torch.device(device).type != "cuda":
        return  # accepted on the CPU, where the data already is
    check_data_fits(loaders, [device])
    for loader in loaders:
        loader.dataset = loader.dataset.to(device)


def _resume(cfg: TrainConfig, strategy: Strategy, log: Callable[[str], None]) -> tuple[int, list[EpochStats]]:
    """(epochs already done, their stats) from cfg.checkpoint_dir, loaded into the strategy."""
    ckpt = checkpoint.load_for(cfg)
    path = checkpoint.checkpoint_path(cfg.checkpoint_dir)
    if ckpt is None:
        log(f"note: no checkpoint in {cfg.checkpoint_dir}: starting from epoch 1")
        return 0, []
    try:
        strategy.load_state_dicts(ckpt["model"], ckpt["optimizer"])
        done = [EpochStats(**e) for e in ckpt["history"]]
    except (RuntimeError, KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {path} does not fit this model: "
                              f"{str(e).strip().splitlines()[0]}") from None
    checkpoint.set_rng_state(ckpt["rng"])
    start_epoch = ckpt["epoch"]
    log(f"note: resuming from {path} after epoch {start_epoch} ({max(cfg.epochs - start_epoch, 0)} epoch(s) left)")
    return start_epoch, done


def _run_in_process(cfg: TrainConfig, fault: Fault | None = None) -> RunResult | None:
    """Everything one process does; under DDP every rank runs this. Rank 0 returns the result."""
    if get_strategy(cfg.strategy).spawns_ranks:
        # tqdm's default lock is a multiprocessing semaphore; a rank stopped by SIGTERM would leave
        # it behind (and a "leaked semaphore" warning). A rank's bars never span processes.
        tqdm.set_lock(threading.RLock())
    devmod.keep_freed_memory()  # activation buffers reused across steps, not faulted in anew
    if cfg.exact_gpu_math or os.environ.get(EXACT_GPU_MATH_ENV) == "1":
        devmod.set_exact_gpu_math()  # for this process's life: the CLI's, or a rank's (the ranks get cfg and the env)
    strategy = get_strategy(cfg.strategy).create(cfg.devices, cfg.strategy_settings())
    try:
        log = print if strategy.is_main else (lambda _: None)
        for note in strategy.notes():
            log(f"note: {note}")
        strategy.use_speed_options(cfg.amp, cfg.channels_last, cfg.compile)
        train_loader, test_loader = make_loaders(cfg)
        if cfg.data_on_device:
            _data_on_device((train_loader, test_loader), strategy.devices[0])
        spec = builtin_spec(cfg.model, width=cfg.width)
        strategy.use_objective(spec.objective)
        strategy.setup(spec.build_seeded(cfg.seed), make_optimizer_factory(cfg))
        strategy.reset_peak_memory()
        start_epoch, done = _resume(cfg, strategy, log) if cfg.resume else (0, [])
        callbacks = [fault] if fault is not None else []
        if cfg.checkpoint_dir:
            callbacks.append(CheckpointSaver(cfg, done))
        trainer = Trainer(strategy, train_loader, test_loader, cfg.loop_settings(), log=log, callbacks=callbacks)
        history = done + trainer.fit(start_epoch)
        result = RunResult(config=cfg.to_dict(), devices=strategy.describe_devices(), notes=strategy.notes(),
                           epochs=history, versions=results.versions(), state_dict=strategy.model_state_dict(),
                           memory=strategy.memory_bytes())
        if strategy.is_main:
            if cfg.out:
                results.write_results(cfg.out, result)
            log(result.memory_line())
            log(result.summary_line())
        return result if strategy.is_main else None
    finally:
        strategy.teardown()


def train(cfg: TrainConfig) -> RunResult:
    """Validate the settings, check the run once before it starts, and run the job with its strategy.

    Every bad input is found here, before any rank starts, as an MgpuError subclass (see
    docs/guide/failures.md); a failing rank then is a LaunchError, a NaN/Inf loss a NonFiniteLossError.
    """
    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"train() needs a TrainConfig, got {type(cfg).__name__}")
    cfg.validate()  # the one check of the values: everything after takes them as they are
    strategy_cls = get_strategy(cfg.strategy)
    settings = cfg.strategy_settings()
    fault = Fault.from_env()  # the MGPU_FAULT test hook: a malformed value fails here, once
    check_before_launch(cfg, strategy_cls, settings)
    return strategy_cls.launch(_Job(cfg, fault), cfg, cfg.devices, settings)


class _Job:
    """What each process runs, picklable for the processes a strategy starts."""

    def __init__(self, cfg: TrainConfig, fault: Fault | None):
        self.cfg, self.fault = cfg, fault

    def __call__(self, cfg: TrainConfig) -> RunResult | None:
        return _run_in_process(cfg, self.fault)
