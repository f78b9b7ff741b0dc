"""Parameter names as the model gives them: wrapper segments stripped (`strip_wrappers`), and the names of
an optimizer's parameters found from the root models, or any module alive (`parameter_names`)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["WRAPPER_SEGMENTS", "strip_wrappers", "wrapper_paths", "parameter_names"]

# Module names that wrappers put into parameter names: anywhere (torch.compile, FSDP1, activation
# checkpointing, Lightning), and "module" at the front (DDP, DataParallel, accelerate's DDP), or wherever a
# DDP or DataParallel sits inside another module (timm's task holds `trainable_module = DDP(model)`).
WRAPPER_SEGMENTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_forward_module")


def wrapper_paths(root: nn.Module) -> tuple[tuple[str, ...], ...]:
    """The name segments, from `root`, of each DDP or DataParallel's `module` child: ("task", "module")
    for root.task = DDP(model). Deepest first, so that stripping one leaves the others' places intact."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    paths = [tuple(filter(None, name.split("."))) + ("module",) for name, m in root.named_modules()
             if isinstance(m, (DistributedDataParallel, DataParallel))]
    return tuple(sorted(paths, key=len, reverse=True))


def strip_wrappers(name: str, wrapped: tuple[tuple[str, ...], ...] = ()) -> str:
    """'module._orig_mod.fc1.weight' -> 'fc1.weight': the names the model itself gives. `wrapped`
    (wrapper_paths of the module the name comes from) drops a wrapper's `module` segment inside the name:
    'task.module.fc1.weight' -> 'task.fc1.weight'."""
    parts = name.split(".")
    for path in wrapped:
        if tuple(parts[:len(path)]) == path:
            del parts[len(path) - 1]
    parts = [p for p in parts if p not in WRAPPER_SEGMENTS]
    while parts and parts[0] == "module":
        parts.pop(0)
    return ".".join(parts)


def parameter_names(roots, index: int, params: list[torch.Tensor]) -> dict[int, str]:
    """id(param) -> its name in the root model that holds it (else in any module alive: a model never
    called as a module, `model.forward(x)`; else `param_groups[i] parameter j`), each name once."""
    found: dict[int, str] = {}
    for root in roots:
        wrapped = wrapper_paths(root)
        for name, p in root.named_parameters():
            found.setdefault(id(p), strip_wrappers(name, wrapped))
    if any(id(p) not in found for p in params):
        import gc

        wanted = {id(p) for p in params} - set(found)
        for obj in gc.get_objects():
            if isinstance(obj, nn.Module) and wanted:
                wrapped = wrapper_paths(obj)
                for name, p in obj.named_parameters():
                    if id(p) in wanted:
                        found[id(p)] = strip_wrappers(name, wrapped)
                        wanted.discard(id(p))
    names, used = {}, set()
    for i, p in enumerate(params):
        name = found.get(id(p)) or f"param_groups[{index}] parameter {i}"
        while name in used:
            name += "'"
        used.add(name)
        names[id(p)] = name
    return names
