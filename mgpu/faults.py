"""The `MGPU_FAULT` test hook: make one rank fail (or lag) on purpose, at a chosen step.

    MGPU_FAULT="rank=1,epoch=2,step=1,kind=kill" python -m mgpu train --strategy ddp --devices 2 ...

`train(cfg)` reads the variable once (a malformed value is a ConfigError before anything starts)
and hands the Trainer a `Fault` callback; the Trainer itself reads no environment variables.
The reliability tests (correctness/test_reliability_*.py) inject faults with it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import torch

from mgpu.errors import ConfigError
from mgpu.trainer import Callback

__all__ = ["FAULT_ENV", "Fault"]

FAULT_ENV = "MGPU_FAULT"


@dataclass(frozen=True)
class Fault(Callback):
    """Fail on purpose at the start of step `step` of epoch `epoch` (both 1-based, as in error
    messages) in rank `rank` (rank 0 is the only one outside DDP).

    Kinds: `raise` (a RuntimeError), `kill` (SIGKILL itself), `exit` (os._exit(3), no report),
    `hang` (sleep forever, as a rank stuck outside a collective), `nan` (that step's input
    becomes NaN, so the loss is NaN), `delay` (sleep `ms` milliseconds, then go on: a slow rank).
    rank, epoch, step and ms default to 0, 1, 1 and 1000.
    """

    kind: str
    rank: int = 0
    epoch: int = 1
    step: int = 1
    ms: int = 1000

    KINDS = ("raise", "kill", "exit", "hang", "nan", "delay")

    @classmethod
    def from_env(cls, environ=os.environ) -> "Fault | None":
        text = environ.get(FAULT_ENV, "").strip()
        if not text:
            return None
        try:
            fields = dict(item.split("=", 1) for item in text.replace(" ", "").split(","))
            fault = cls(kind=fields.pop("kind"), **{k: int(v) for k, v in fields.items()})
        except (ValueError, TypeError, KeyError):
            raise ConfigError(f"{FAULT_ENV}={text!r} is not a fault: write kind=KIND[,rank=R][,epoch=E][,step=S][,ms=M] "
                              f"with KIND one of {', '.join(cls.KINDS)}") from None
        if fault.kind not in cls.KINDS:
            raise ConfigError(f"{FAULT_ENV}: unknown kind {fault.kind!r}: choose one of {', '.join(cls.KINDS)}")
        return fault

    # -- as a Trainer callback -----------------------------------------------------------------
    def before_step(self, trainer, epoch: int, step: int, X: torch.Tensor) -> torch.Tensor:
        """Called before every step (epoch and step 0-based); returns the step's input."""
        rank = trainer.strategy.rank
        if (rank, epoch + 1, step + 1) != (self.rank, self.epoch, self.step):
            return X
        print(f"mgpu: {FAULT_ENV}: injecting {self.kind} at rank {rank}, epoch {self.epoch}, step {self.step}",
              file=sys.stderr, flush=True)
        if self.kind == "raise":
            raise RuntimeError(f"injected fault ({FAULT_ENV}) at epoch {self.epoch}, step {self.step}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "exit":
            os._exit(3)
        if self.kind == "hang":
            while True:
                time.sleep(1)
        if self.kind == "delay":
            time.sleep(self.ms / 1000)
            return X
        return X * float("nan")
