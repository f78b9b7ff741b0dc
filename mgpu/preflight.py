"""What `python -m mgpu train` checks once, before any rank starts (`train(cfg)`, mgpu/run.py, calls it).

    python -m mgpu train --strategy ddp --devices 2 --amp bf16   # a GPU without bfloat16: one line, exit 2, no rank

`check_before_launch(cfg, strategy_cls, settings)` takes a cfg that TrainConfig.validate has checked
and makes every check of what the run will meet, each once, in this order: the model takes the
images; the output and checkpoint folders can be written (and the checkpoint resumed, or none
overwritten); for a strategy that starts ranks of its own, the data each rank would read and what
the ranks' devices must offer (bfloat16 for --amp bf16, room for --data-on-device); last the
strategy's own checks (`Strategy.preflight`). Each check lives in the module it is about and takes
the values as validated; this function only calls them in order, one module after the other, so a
run's options are followed down one page and never back into a module already left.
"""

from __future__ import annotations

from mgpu import checkpoint, launch, results
from mgpu import devices as devmod
from mgpu.config import StrategySettings, TrainConfig
from mgpu.data import dataset_bytes, make_loaders
from mgpu.models import check_takes_images
from mgpu.strategies import Strategy

__all__ = ["check_before_launch"]


def check_before_launch(cfg: TrainConfig, strategy_cls: type[Strategy], settings: StrategySettings) -> None:
    """Every check of a validated cfg before the run starts, in order: the first that fails raises its
    MgpuError subclass (ShapeError, OutputDirError, CheckpointError, DataError, DeviceError, ...)."""
    check_takes_images(cfg.model, cfg.width, cfg.resize)
    if launch.is_global_rank_0():  # under torchrun every rank runs train; only global rank 0 writes files
        if cfg.out:
            results.check_writable(cfg.out)
        if cfg.checkpoint_dir:
            results.check_writable(cfg.checkpoint_dir, what="checkpoint folder")
            checkpoint.check_before_run(cfg)
    if strategy_cls.spawns_ranks and not launch.under_launcher():
        # What each rank would find for itself, found here once rather than in every rank (under torchrun,
        # where every rank runs train, each finds it for itself): missing, corrupt or too few Fashion-MNIST
        # files; the size of what --data-on-device puts on each rank's device; the devices themselves.
        loaders = make_loaders(cfg) if cfg.data == "fashion-mnist" or cfg.data_on_device else ()
        data_bytes = dataset_bytes(loaders)
        node = devmod.devices(cfg.devices, require_gpus=cfg.require_gpus, kind=cfg.device)  # the ranks' devices
        devmod.check_amp(cfg.amp, node)
        if cfg.data_on_device:
            for device in node:  # every rank holds the datasets on its own device
                devmod.check_fits(data_bytes, device)
    strategy_cls.preflight(cfg.devices, settings)
