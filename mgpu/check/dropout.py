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

Stochastic depth is a sibling of dropout: timm's `drop_path` (its `DropPath` module, which timm's
ViT, ConvNeXt, EfficientNet, ... put in every block for `drop_path_rate`) and torchvision's
`stochastic_depth` (`StochasticDepth`, in its ConvNeXt, EfficientNet, Swin) draw one keep mask per
example and zero whole residual branches. They are Python functions, not torch's, so the mode
knows them by the frame that draws the mask: a `Tensor.bernoulli_` called from one of
STOCHASTIC_DEPTH_FUNCTIONS fills the mask with ones instead, and the `div_` by the keep
probability that follows on that mask is skipped, so the branch passes through unchanged
(`x * 1.0`, bitwise `x`). The calls are counted with dropout's (`calls`), under the names in
STOCHASTIC_DEPTH_FUNCTIONS; `stochastic_depth_modules(model)` names the modules.
"""

from __future__ import annotations

import collections
import sys
import threading

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["DropoutOff", "hold_dropout_off", "DROPOUT_FUNCTIONS", "STOCHASTIC_DEPTH_FUNCTIONS",
           "STOCHASTIC_DEPTH_MODULES", "stochastic_depth_modules", "random_layer_modules", "stochastic_depth_caller"]

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


# Stochastic depth, by the module that defines the function and the function's name -> the name its
# calls are counted under (`DropoutOff.calls`).
STOCHASTIC_DEPTH_FUNCTIONS = {
    ("timm.layers.drop", "drop_path"): "timm drop_path (stochastic depth)",
    ("timm.models.layers.drop", "drop_path"): "timm drop_path (stochastic depth)",  # timm < 0.9
    ("torchvision.ops.stochastic_depth", "stochastic_depth"): "torchvision stochastic_depth",
}
# The modules that apply them: class names, as timm and torchvision spell them.
STOCHASTIC_DEPTH_MODULES = ("DropPath", "StochasticDepth")


def _drops(m: nn.Module) -> bool:
    return bool(getattr(m, "drop_prob", None) or getattr(m, "p", None))


def stochastic_depth_modules(model: nn.Module) -> list[str]:
    """Names of the model's stochastic-depth modules (timm's DropPath, torchvision's StochasticDepth)
    whose probability is above 0."""
    return [name or type(m).__name__ for name, m in model.named_modules()
            if type(m).__name__ in STOCHASTIC_DEPTH_MODULES and _drops(m)]


def random_layer_modules(model: nn.Module) -> list[str]:
    """Every module of `model` that DropoutOff switches off, as a `random-layers` finding lists them,
    each with its kind: `drop (Dropout)`, `attn (MultiheadAttention)`, `blocks.3.drop_path1 (DropPath)`."""
    found = []
    for name, m in model.named_modules():
        kind = type(m).__name__
        if (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0) or (
                isinstance(m, nn.MultiheadAttention) and m.dropout > 0) or (
                kind in STOCHASTIC_DEPTH_MODULES and _drops(m)):
            found.append(f"{name or kind} ({kind})")
    return found


def stochastic_depth_caller() -> str | None:
    """The name (STOCHASTIC_DEPTH_FUNCTIONS) of the stochastic-depth function whose tensor method a
    TorchFunctionMode is handling, or None: the first frame up the stack that is no
    `__torch_function__` (modes may be stacked or subclassed) is the method's caller."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name in ("__torch_function__", "stochastic_depth_caller"):
        frame = frame.f_back
    if frame is None or frame.f_code.co_name not in ("drop_path", "stochastic_depth"):
        return None
    return STOCHASTIC_DEPTH_FUNCTIONS.get((frame.f_globals.get("__name__"), frame.f_code.co_name))


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
        self._masks: set[int] = set()  # ids of stochastic-depth masks filled with ones, whose div_ is skipped

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.bernoulli_ or (func is torch.Tensor.div_ and self._masks):
            name = stochastic_depth_caller()
            if name is not None:  # stochastic depth: the mask is all ones, not divided by the keep probability
                mask = args[0]
                if func is torch.Tensor.div_:
                    if id(mask) in self._masks:
                        self._masks.discard(id(mask))
                        return mask
                else:
                    with self._lock:
                        self.calls[name] += 1
                    with torch.no_grad():
                        mask.fill_(1.0)
                    self._masks = {id(mask)}  # the one mask its caller divides next (if it scales by keep)
                    return mask
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
