"""What a run gives back (`EpochStats`, `RunResult`) and leaves in its output folder:
results.json, accuracy.png and model.pt."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

import mgpu
from mgpu.errors import OutputDirError

__all__ = ["EpochStats", "RunResult", "versions", "check_writable", "atomic_write", "write_results"]


@dataclass
class EpochStats:
    epoch: int              # 1-based
    loss: float             # mean training loss over the epoch's examples
    train_acc: float        # training accuracy, measured during the epoch (train mode)
    test_acc: float         # accuracy over the whole test set after the epoch (eval mode)
    seconds: float          # training time of the epoch: the slowest rank's, all devices synchronised
    eval_seconds: float     # evaluation time, not part of `seconds`
    images_per_sec: float   # training examples per second of `seconds`
    skipped_steps: int = 0  # steps whose update was skipped for a non-finite loss
    rank_seconds: list[float] = field(default_factory=list)  # each rank's own training time; `seconds` is their max


MEMORY_LABELS = (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer", "optimizer state"),
                 ("peak_allocated", "peak allocated"))


@dataclass
class RunResult:
    config: dict
    devices: str
    notes: list[str]
    epochs: list[EpochStats]
    versions: dict
    state_dict: dict = field(repr=False, default_factory=dict)  # final weights, CPU tensors
    memory: dict = field(default_factory=dict)  # bytes per device (rank 0's): Strategy.memory_bytes()

    @property
    def test_acc(self) -> float:
        return self.epochs[-1].test_acc if self.epochs else float("nan")

    @property
    def sec_per_epoch(self) -> float:
        return sum(e.seconds for e in self.epochs) / len(self.epochs) if self.epochs else float("nan")

    def summary_line(self) -> str:
        """The chapter's closing line."""
        return f"test acc: {self.test_acc:.2f}, {self.sec_per_epoch:.1f} sec/epoch on {self.devices}"

    def memory_line(self) -> str:
        """What one device held for training, e.g. `memory per device: parameters 0.2 MB, ...`."""
        parts = [f"{label} {self.memory[key] / 2**20:.2f} MiB" for key, label in MEMORY_LABELS if key in self.memory]
        return "memory per device: " + ", ".join(parts)

    def to_json(self) -> dict:
        return {"summary": self.summary_line(), "test_acc": self.test_acc, "sec_per_epoch": self.sec_per_epoch,
                "devices": self.devices, "notes": self.notes, "config": self.config, "memory_per_device": self.memory,
                "epochs": [asdict(e) for e in self.epochs], "versions": self.versions}


def versions() -> dict:
    return {"mgpu": mgpu.__version__, "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "platform": platform.platform()}


def check_writable(out: str | os.PathLike, what: str = "output folder") -> Path:
    """Create the folder if needed and prove a file can be written there, before training starts.

    OutputDirError names the folder and the reason (e.g. a parent that is a file, no permission).
    """
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"{what} {path} cannot be written: it is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".mgpu-write-test-"):
            pass
    except OSError as e:
        raise OutputDirError(f"{what} {path} cannot be written: {e.strerror or e}") from None
    return path


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Replace `path` all at once: `write(tmp)` writes PATH.tmp, which is flushed to disk and then
    renamed over `path` (`os.replace` is atomic). Whoever reads `path`, even after a crash at any
    moment, finds the old file or the new one, never half of one. OSError as raised."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def plot_accuracy(result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = [e.epoch for e in result.epochs]
    fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=120)
    ax.plot(epochs, [e.test_acc for e in result.epochs], marker="o", label="test acc")
    ax.plot(epochs, [e.train_acc for e in result.epochs], linestyle="--", label="train acc")
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy")
    ax.set_xlim(0.8, max(epochs[-1], 2) + 0.2)  # a margin, so the first and last points show whole
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    cfg = result.config
    ax.set_title(f"{cfg['model']}, {cfg['strategy']} on {len(result.devices.split(', '))} device(s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def write_results(out: str | os.PathLike, result) -> Path:
    """Write results.json, accuracy.png and model.pt into `out`; return the folder."""
    path = check_writable(out)
    try:
        atomic_write(path / "results.json", lambda p: p.write_text(json.dumps(result.to_json(), indent=2) + "\n"))
        atomic_write(path / "accuracy.png", lambda p: plot_accuracy(result, p))
        atomic_write(path / "model.pt", lambda p: torch.save(result.state_dict, p))
    except OSError as e:
        raise OutputDirError(f"cannot write results into {path}: {e.strerror or e}") from None
    return path
