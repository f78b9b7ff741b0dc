"""Moving data between devices: batch scatter and allreduce, from scratch and torch's.

    >>> Xs, ys = split_batch(X, y, devices(3))   # contiguous shards, sizes 4, 3, 3 for a batch of 10
    >>> allreduce([p.grad for p in same_param_on_each_replica])   # in place: every tensor = the sum

`allreduce` is the chapter's: sum onto the first device, copy the sum back to the others.
`ring_allreduce` is what NCCL and gloo do at scale: a reduce-scatter then an all-gather around
a ring, each device sending 2(n-1)/n of the message instead of the first device receiving n-1 copies.
`all_sum` wraps `torch.distributed.all_reduce` for the DDP strategy and is the identity outside a
process group, so callers never ask which world they run in.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from mgpu.devices import to_device
from mgpu.errors import ConfigError, ShapeError

__all__ = ["shard_sizes", "shard_bounds", "split_batch", "allreduce", "ring_allreduce", "all_sum"]


def shard_sizes(batch_size: int, n: int) -> list[int]:
    """Sizes of n contiguous shards of a batch: they differ by at most one, larger ones first.

    Shards may be empty when batch_size < n (evaluation allows that; training does not).
    """
    base, extra = divmod(batch_size, n)
    return [base + (i < extra) for i in range(n)]


def shard_bounds(batch_size: int, n: int, i: int) -> tuple[int, int]:
    """[start, stop) of shard i among n contiguous shards of a batch."""
    sizes = shard_sizes(batch_size, n)
    start = sum(sizes[:i])
    return start, start + sizes[i]


def _check_devices(devices: Sequence) -> list[torch.device]:
    if devices is None or len(devices) == 0:
        raise ConfigError("no devices given: pass at least one device")
    return [torch.device(d) for d in devices]


def split_batch(X, y: torch.Tensor, devices: Sequence) -> tuple[list, list[torch.Tensor]]:
    """Split a batch into len(devices) contiguous shards, in order, each moved to its device.

    X is one tensor or a tuple of tensors (a model with several inputs), examples along dim 0;
    the shards of X come in the same form.
    """
    devs = _check_devices(devices)
    inputs = X if isinstance(X, (tuple, list)) else (X,)
    for i, t in enumerate(inputs):
        if t.shape[0] != y.shape[0]:
            what = "X" if len(inputs) == 1 else f"input {i}"
            raise ShapeError(f"{what} has {t.shape[0]} examples but y has {y.shape[0]}: they must match")
    if y.shape[0] < len(devs):
        raise ConfigError(f"batch of {y.shape[0]} examples is smaller than the {len(devs)} devices to split it over")
    sizes = shard_sizes(y.shape[0], len(devs))
    # to_device: queued copies (pinned memory, non_blocking), so the host never waits between devices.
    shards = [[to_device(s, d) for s, d in zip(t.split(sizes), devs)] for t in inputs]  # [input][device]
    X_shards = shards[0] if not isinstance(X, (tuple, list)) else [tuple(per_input) for per_input in zip(*shards)]
    return X_shards, [to_device(s, d) for s, d in zip(y.split(sizes), devs)]


def _check_same_kind(tensors: Sequence[torch.Tensor]) -> None:
    if len(tensors) == 0:
        raise ConfigError("allreduce needs at least one tensor")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], start=1):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ShapeError(
                f"tensor {i} is {tuple(t.shape)} {t.dtype} but tensor 0 is {tuple(first.shape)} {first.dtype}: "
                "allreduce needs one tensor of the same shape and dtype per device")


def allreduce(tensors: Sequence[torch.Tensor]) -> None:
    """In place: sum every tensor onto the first one's device, then copy the sum back to all."""
    _check_same_kind(tensors)
    with torch.no_grad():
        for t in tensors[1:]:
            tensors[0].add_(t.to(tensors[0].device))
        for t in tensors[1:]:
            t.copy_(tensors[0])  # copy_ moves across devices; every tensor ends bitwise equal


def ring_allreduce(tensors: Sequence[torch.Tensor]) -> None:
    """In place: ring reduce-scatter then ring all-gather over the devices, in list order.

    Device i's tensor is cut into n chunks. In reduce-scatter step s, device i passes chunk
    (i - s) mod n to device i + 1, which adds it to its own; after n - 1 steps device i holds the
    full sum of chunk (i + 1) mod n. All-gather then passes the finished chunks around the ring,
    overwriting, so every device ends with bitwise the same values.
    """
    _check_same_kind(tensors)
    n = len(tensors)
    if n == 1:
        return
    with torch.no_grad():
        flats = [t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1) for t in tensors]
        chunks = [f.tensor_split(n) for f in flats]  # chunks[device][chunk], views into flats
        for step in range(n - 1):
            sent = [chunks[i][(i - step) % n].to(flats[(i + 1) % n].device) for i in range(n)]
            for i in range(n):
                chunks[(i + 1) % n][(i - step) % n].add_(sent[i])
        for step in range(n - 1):
            sent = [chunks[i][(i + 1 - step) % n].to(flats[(i + 1) % n].device) for i in range(n)]
            for i in range(n):
                chunks[(i + 1) % n][(i + 1 - step) % n].copy_(sent[i])
        for t, f in zip(tensors, flats):
            if f.data_ptr() != t.data_ptr():  # t was not contiguous: write the result back
                t.copy_(f.view_as(t))


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks, in place; identity outside a process group."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t
