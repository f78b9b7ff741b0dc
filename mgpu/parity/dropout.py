"""Dropout switched off wherever a model applies it: in `nn.Dropout` modules and in direct calls.

    off = DropoutOff()
    with off:                                  # this thread: every dropout probability is 0
        model(x)
    hold_dropout_off(model, off)               # or: whenever the model runs, in any thread or process
    off.calls                                  # {"scaled_dot_product_attention(dropout_p=0.1)": 12, ...}

Much model code never calls its dropout modules: transformers' attention passes
`dropout=self.attn_dropout.p if self.training else 0.0` to `F.scaled_dot_product_attention`
(`dropout_p`) or to `F.dropout`, and so do timm's ViT and nanoGPT. Putting the modules in eval
mode leaves those on. `DropoutOff` is a `TorchFunctionMode`: it sees each call of torch's dropout
functions, whoever makes it, and runs it with probability 0. What is left that draws random
numbers (noise, sampling, a home-made mask) is other randomness, which no switch can remove.
"""

from __future__ import annotations

import collections
import threading

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["DropoutOff", "hold_dropout_off", "DROPOUT_FUNCTIONS"]

# torch's functions that drop at random: where their probability is (keyword, position) and where
# their "training" flag is (None: they have none and always drop). F.multi_head_attention_forward
# (nn.MultiheadAttention) passes its own on to the others.
_P, _TRAINING = ("p", 1), ("training", 2)
DROPOUT_FUNCTIONS = {
    **{f: (_P, _TRAINING) for f in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
                                    F.feature_alpha_dropout)},
    **{f: (_P, ("train", 2)) for f in (torch.dropout, torch.feature_dropout, torch.alpha_dropout,
                                       torch.feature_alpha_dropout)},
    F.scaled_dot_product_attention: (("dropout_p", 4), None),
    F.multi_head_attention_forward: (("dropout_p", 10), ("training", 13)),
}


def _argument(args: tuple, kwargs: dict, where, default):
    name, position = where
    if name in kwargs:
        return kwargs[name]
    return args[position] if len(args) > position else default


class DropoutOff(TorchFunctionMode):
    """While active (in the thread that entered it), every call of DROPOUT_FUNCTIONS runs with
    probability 0; `calls` counts those that asked for more, by function and probability."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        found = DROPOUT_FUNCTIONS.get(func)
        if found is not None:
            (name, position), training = found
            p = _argument(args, kwargs, (name, position), 0.0)
            if p and (training is None or _argument(args, kwargs, training, True)):
                with self._lock:
                    self.calls[f"{func.__name__}({name}={p:g})"] += 1
            if name in kwargs or len(args) <= position:
                kwargs[name] = 0.0
            else:
                args = (*args[:position], 0.0, *args[position + 1:])
        return func(*args, **kwargs)


def hold_dropout_off(model: nn.Module, mode: DropoutOff) -> None:
    """Every forward of `model` (and of its copies: deepcopy keeps the hooks) runs inside `mode`,
    in whichever thread or process it runs; the hooks are the model's root's, so DDP, FSDP and
    DataParallel's replica threads all pass through them."""
    def enter(module, args):
        mode.__enter__()

    def leave(module, args, output):
        mode.__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave, always_call=True)
