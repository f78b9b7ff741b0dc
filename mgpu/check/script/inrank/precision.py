"""The precision a script computes at, seen from inside a rank, and the switch that lifts it to float32.

    seen = PrecisionSeen()
    seen.forward(root_module)         # at each training forward of a root model: autocast, parameter dtypes
    seen.output(output)               # the root's output dtype (FSDP2's MixedPrecisionPolicy shows here)
    seen.lowest                       # "bfloat16", "float16" or "float32"
    with LiftPrecision() as lift:     # autocast and FSDP2's MixedPrecisionPolicy switched off for the script
        ...
    lift.lifted                       # {"autocast(cpu, bfloat16)": 12}: what it switched off

Mixed precision makes world N differ from world 1 by the low precision's rounding (a bf16 weight
gradient summed over 16 rows on each rank, not over 32 rows on one), far above float32's. A loop bug
does not depend on the precision, so check-script compares the loop's arithmetic with the precision
lifted to float32 (autocast and FSDP2's mixed-precision policy off: the same loop at float32's
sensitivity), and the run as it is against world 1 as it is, within the precision's own rounding in
this computation (world 1 as run against world 1 lifted: the yardstick). A model whose parameters are
themselves bf16 or fp16 (cast whole) cannot be lifted: it is compared as run, its rerun perturbed by
roundings of its own dtype (docs/guide/check-script.md, "Mixed precision").
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["PrecisionSeen", "LiftPrecision", "LOW", "lower"]

# Floating dtypes below float32, lowest precision first.
LOW = ("bfloat16", "float16")
_ORDER = {"bfloat16": 0, "float16": 1, "float32": 2, "float64": 3}


def lower(a: str, b: str) -> str:
    """The lower precision of two dtype names."""
    return a if _ORDER.get(a, 2) <= _ORDER.get(b, 2) else b


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class PrecisionSeen:
    """What the training forwards of a rank ran at: autocast (device, dtype), the root models'
    parameter dtypes, their outputs' dtypes."""

    def __init__(self):
        self.autocast: set[str] = set()      # "cpu:bfloat16"
        self.params: set[str] = set()        # floating dtypes of the root models' parameters
        self.outputs: set[str] = set()       # floating dtypes of the root models' outputs

    def forward(self, root: torch.nn.Module) -> None:
        self.inside()
        for p in root.parameters():
            if p.is_floating_point():
                self.params.add(_name(p.dtype))

    def inside(self) -> None:
        """Autocast as it is now: at a root's training forward, and at the modules inside it (a wrapper
        such as accelerate's enters autocast inside the root's forward and casts its output to float32)."""
        for device in ("cpu", "cuda"):
            try:
                if torch.is_autocast_enabled(device):
                    self.autocast.add(f"{device}:{_name(torch.get_autocast_dtype(device))}")
            except (RuntimeError, TypeError):  # a device type this build does not know
                continue

    def output(self, output) -> None:
        t = output
        if isinstance(output, (tuple, list)) and output:
            t = output[0]
        elif isinstance(output, dict) and output:
            t = output.get("logits", next(iter(output.values())))
        elif hasattr(output, "logits"):
            t = output.logits
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            self.outputs.add(_name(t.dtype))

    @property
    def lowest(self) -> str:
        names = [a.split(":")[1] for a in self.autocast] + list(self.params) + list(self.outputs)
        out = "float32"
        for n in names:
            out = lower(n, out)
        return out

    @property
    def cast_whole(self) -> bool:
        """Parameters themselves below float32: nothing to lift."""
        return any(p in LOW for p in self.params)

    def to_json(self) -> dict:
        return {"lowest": self.lowest, "autocast": sorted(self.autocast), "params": sorted(self.params),
                "outputs": sorted(self.outputs)}


class LiftPrecision:
    """autocast (torch.autocast and its cpu/cuda subclasses, as context manager and decorator) and
    FSDP2's MixedPrecisionPolicy made float32 for the script: what they would have lowered is counted
    in `lifted`. Installed before the script's first line (rank.py), so that names the script imports
    are already the lifted ones."""

    def __init__(self):
        self.lifted: dict[str, int] = {}
        self._saved: list = []

    def _count(self, what: str) -> None:
        self.lifted[what] = self.lifted.get(what, 0) + 1

    def __enter__(self) -> "LiftPrecision":
        from torch.amp import autocast_mode

        original_init = autocast_mode.autocast.__init__
        lift = self

        def init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if enabled:
                lift._count(f"autocast({device_type}{', ' + _name(dtype) if dtype is not None else ''})")
            original_init(self, device_type, dtype=dtype, enabled=False, cache_enabled=cache_enabled)

        self._saved.append((autocast_mode.autocast, "__init__", original_init))
        autocast_mode.autocast.__init__ = init
        self._lift_fsdp_policy()
        self._lift_module_casts()
        return self

    def _lift_module_casts(self) -> None:
        """A model cast whole (`model.to(torch.bfloat16)`, `.bfloat16()`, `.half()`) keeps float32
        parameters (a device in the same `.to` still moves it), and a module whose parameters are
        float32 gets its low-precision floating inputs in float32 (the batch the script casts down)."""
        from torch import nn

        lift = self
        original_to, original_half, original_bf16 = nn.Module.to, nn.Module.half, nn.Module.bfloat16

        def to(module, *args, **kwargs):
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
            if dtype is not None and _name(dtype) in LOW:
                lift._count(f"Module.to({_name(dtype)})")
                if device is None and memory_format is None:
                    return module
                return original_to(module, device=device, non_blocking=non_blocking,
                                   **({"memory_format": memory_format} if memory_format is not None else {}))
            return original_to(module, *args, **kwargs)

        def kept(name):
            def cast(module, *args, **kwargs):
                lift._count(f"Module.{name}()")
                return module
            return cast

        for attr, value in (("to", to), ("half", kept("half")), ("bfloat16", kept("bfloat16"))):
            self._saved.append((nn.Module, attr, {"to": original_to, "half": original_half,
                                                  "bfloat16": original_bf16}[attr]))
            setattr(nn.Module, attr, value)
        from torch.nn.modules import module as module_hooks

        self._hook = module_hooks.register_module_forward_pre_hook(_inputs_up)

    def _lift_fsdp_policy(self) -> None:
        try:
            from torch.distributed import fsdp
        except ImportError:
            return
        policy = getattr(fsdp, "MixedPrecisionPolicy", None)
        if policy is None or not dataclasses.is_dataclass(policy):
            return
        lift = self

        def lifted_policy(*args, **kwargs):
            made = policy(*args, **kwargs)
            if made.param_dtype is not None or made.reduce_dtype is not None:
                lift._count(f"MixedPrecisionPolicy(param_dtype={made.param_dtype}, reduce_dtype={made.reduce_dtype})")
            return dataclasses.replace(made, param_dtype=None, reduce_dtype=None, output_dtype=None)

        self._saved.append((fsdp, "MixedPrecisionPolicy", policy))
        fsdp.MixedPrecisionPolicy = lifted_policy

    def __exit__(self, *exc) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved = []
        if getattr(self, "_hook", None) is not None:
            self._hook.remove()
            self._hook = None


def _inputs_up(module, args):
    """A module with float32 parameters called on bf16/fp16 tensors: the tensors in float32."""
    param = next(module.parameters(recurse=False), None)
    if param is None or param.dtype != torch.float32:
        return None
    if not any(isinstance(a, torch.Tensor) and a.is_floating_point() and _name(a.dtype) in LOW for a in args):
        return None
    return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() and _name(a.dtype) in LOW else a
                 for a in args)
