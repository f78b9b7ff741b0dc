"""Checkpoints: save after every epoch, atomically; resume from the last complete one.

    python -m mgpu train ... --checkpoint-dir ckpt            # writes ckpt/checkpoint.pt after each epoch
    python -m mgpu train ... --checkpoint-dir ckpt --resume   # continues after the last saved epoch

One file, `checkpoint.pt`, replaced after each epoch: it is written to `checkpoint.pt.tmp`,
flushed to disk, then renamed over the old one (`os.replace` is atomic), so a run killed at any
moment leaves either the previous complete checkpoint or the new one, never half of one. Under
DDP only rank 0 writes it; every rank reads it on resume.

A checkpoint holds the model and optimizer state (as the strategy gives them: plain keys, CPU
tensors), the number of completed epochs, the history of those epochs, the RNG states (torch,
CUDA if initialised, Python `random`, NumPy if installed) and a fingerprint of the settings that
decide the training trajectory. Resuming with a different fingerprint is a `CheckpointError`;
strategy and device count may change, since every strategy computes the same training (within
float rounding: only the same strategy and device count resume bitwise exactly). The number of
epochs may grow. A truncated, corrupt or foreign file is a `CheckpointError`, never a silent
fresh start.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from mgpu.errors import CheckpointError, OutputDirError, one_line
from mgpu.results import atomic_write

__all__ = ["CHECKPOINT_NAME", "FINGERPRINT_FIELDS", "fingerprint", "checkpoint_path", "save", "load",
           "load_for", "check_before_run", "rng_state", "set_rng_state"]

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT = "mgpu-checkpoint"
VERSION = 1
# Settings that decide the weights after each epoch. Left out on purpose: strategy, devices,
# epochs (may grow), evaluation size, output, progress, ports and timeouts.
FINGERPRINT_FIELDS = ("model", "width", "data", "resize", "train_size", "seed", "batch_size", "lr", "momentum",
                      "weight_decay")
_REQUIRED_KEYS = ("format", "version", "epoch", "model", "optimizer", "rng", "fingerprint", "history")


def fingerprint(cfg) -> dict:
    return {name: getattr(cfg, name) for name in FINGERPRINT_FIELDS}


def checkpoint_path(directory: str | os.PathLike) -> Path:
    return Path(directory) / CHECKPOINT_NAME


def rng_state() -> dict:
    """Every RNG state a run may draw from, as tensors and plain values (loadable with weights_only)."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:  # numpy is optional: nothing in mgpu draws from it
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            return
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


def save(directory: str | os.PathLike, *, cfg, epoch: int, model_state: dict, optimizer_state: dict,
         history: list[dict]) -> Path:
    """Write the checkpoint after `epoch` completed epochs: tmp file, fsync, atomic rename."""
    path = checkpoint_path(directory)
    payload = {"format": FORMAT, "version": VERSION, "epoch": int(epoch), "model": model_state,
               "optimizer": optimizer_state, "rng": rng_state(), "fingerprint": fingerprint(cfg),
               "history": list(history), "strategy": cfg.strategy, "devices": cfg.devices}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: torch.save(payload, tmp))
    except OSError as e:
        raise OutputDirError(f"cannot write checkpoint {path}: {e.strerror or e}") from None
    return path


def load(directory: str | os.PathLike) -> dict | None:
    """The checkpoint in `directory`, checked for completeness; None when there is none.

    A leftover `checkpoint.pt.tmp` (a run killed while saving) is ignored: the rename never
    happened, so `checkpoint.pt`, if any, is the last complete one.
    """
    path = checkpoint_path(directory)
    if not path.exists():
        return None
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip, pickle and EOF errors all mean the same: unusable file
        first = one_line(e).split(". ")[0]
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({first}); delete it to start afresh, "
                              "or resume from a good copy") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an mgpu checkpoint")
    if ckpt.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {ckpt.get('version')!r}, "
                              f"this mgpu reads version {VERSION}")
    missing = [k for k in _REQUIRED_KEYS if k not in ckpt]
    if missing or not isinstance(ckpt["epoch"], int) or ckpt["epoch"] < 1:
        raise CheckpointError(f"checkpoint {path} is incomplete (missing {', '.join(missing) or 'a valid epoch'})")
    return ckpt


def load_for(cfg) -> dict | None:
    """The checkpoint to resume `cfg` from (None when there is none), or CheckpointError when
    it cannot be used: corrupt, or written by a run with other training settings."""
    ckpt = load(cfg.checkpoint_dir)
    if ckpt is None:
        return None
    path = checkpoint_path(cfg.checkpoint_dir)
    mine = fingerprint(cfg)
    theirs = ckpt["fingerprint"]
    differ = [f"{k} {theirs.get(k)!r} -> {mine[k]!r}" for k in FINGERPRINT_FIELDS if theirs.get(k) != mine[k]]
    if differ:
        raise CheckpointError(f"checkpoint {path} was written with other settings ({'; '.join(differ)}): "
                              "resume with the same settings, or use another --checkpoint-dir")
    return ckpt


def check_before_run(cfg) -> None:
    """CheckpointError now, before any rank starts, when a run with a checkpoint folder could not use
    it: the checkpoint to resume from is corrupt, truncated or written with other settings (each rank
    would fail on it), or, without resume, one is there that the run would overwrite."""
    if cfg.resume:
        load_for(cfg)
    elif checkpoint_path(cfg.checkpoint_dir).exists():
        raise CheckpointError(f"{checkpoint_path(cfg.checkpoint_dir)} already exists: pass --resume "
                              "to continue that run, or choose an empty --checkpoint-dir")
