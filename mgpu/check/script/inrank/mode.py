"""The script's whole run under the recorder's torch function mode (recorder.py): dropout and stochastic
depth off (mgpu's DropoutOff), the random numbers drawn counted and placed, each `Tensor.backward` counted
(and, under --whole-run at N ranks, DDP's gradient all-reduce it runs published: meeting.py); and the
recorder's own draws kept out of the count (`_Uncounted`)."""

from __future__ import annotations

import torch

from mgpu.check.dropout import DropoutOff, stochastic_depth_caller
from mgpu.check.script.inrank.draws import RANDOM_FUNCTIONS
from mgpu.check.script.inrank.float64 import promote

__all__ = ["ScriptMode"]


class ScriptMode(DropoutOff):
    """DropoutOff for the whole script, and a count of the random numbers drawn inside a root
    model's forward (what no switch removes: noise layers, sampling, home-made masks)."""

    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        rec = self.recorder
        if rec.float64:  # confirm.py's runs: an op mixing float32 with float64 computes in float64
            args, kwargs = promote(func, args, kwargs or {})
        if func in RANDOM_FUNCTIONS and not rec.quiet and not rec.in_backward() and not (
                func is torch.Tensor.bernoulli_ and stochastic_depth_caller() is not None):
            rec.classify_draw(RANDOM_FUNCTIONS[func], args, kwargs or {})
        if func is torch.Tensor.backward:  # forwards between two backward passes fed one loss (data.py)
            rec.backwards += 1
            if rec.meeting is not None and rec.ddp_forward:  # DDP's all-reduce: a meeting of the ranks (meeting.py)
                rec.ddp_forward = False
                return rec.meeting.backward(lambda: super(ScriptMode, self).__torch_function__(func, types, args, kwargs))
        return super().__torch_function__(func, types, args, kwargs)


class _Uncounted:
    """The recorder's own random draws kept out of the count of the script's."""

    def __init__(self, recorder):
        self.recorder = recorder

    def __enter__(self):
        self.saved, self.recorder.quiet = self.recorder.quiet, True

    def __exit__(self, *exc):
        self.recorder.quiet = self.saved
