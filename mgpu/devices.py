"""Device discovery with a CPU fallback.

    >>> from mgpu.devices import devices, describe
    >>> describe(devices(2))          # on a machine without GPUs
    '[cpu (emulated 0), cpu (emulated 1)]'

On a machine with fewer GPUs than asked for, `devices(n)` emulates n devices on the CPU: n model
replicas (manual strategy) or n processes (DDP) that share the CPU. The numbers are right, the
speed is the CPU's. Pass `require_gpus=True` to make a missing GPU an error instead, and
`kind="cpu"` to keep every device on the CPU beside GPUs (`--device cpu`). The rules are pure
functions of the GPU count (`place`, `rank_placement`, `comparison_kind`).
"""

from __future__ import annotations

import contextlib
import os

import torch

from mgpu.config import DEVICE_KINDS
from mgpu.errors import ConfigError, DeviceError
from mgpu.memory import keep_freed_memory  # torch-free, re-exported here

__all__ = ["DeviceList", "DEVICE_KINDS", "try_gpu", "try_all_gpus", "place", "devices", "rank_placement", "shared_gpus",
           "comparison_kind", "gpu_count", "synchronize", "describe",
           "usable_cores", "torch_threads", "exact_gpu_math", "set_exact_gpu_math", "keep_freed_memory", "to_device", "supports_bf16", "check_amp", "check_fits"]


class DeviceList(list):
    """A list of `torch.device` that remembers whether it stands for emulated devices."""

    def __init__(self, items=(), emulated: bool = False):
        super().__init__(torch.device(d) for d in items)
        self.emulated = emulated

    def __repr__(self) -> str:
        return describe(self)


def gpu_count() -> int:
    """Number of visible CUDA devices; asks the driver without initialising CUDA."""
    return torch.cuda.device_count()


def try_gpu(i: int = 0) -> torch.device:
    """GPU `i` if it exists, else the CPU."""
    if not isinstance(i, int) or isinstance(i, bool) or i < 0:
        raise ConfigError(f"GPU index must be a non-negative integer, got {i!r}")
    return torch.device(f"cuda:{i}") if i < gpu_count() else torch.device("cpu")


def try_all_gpus() -> DeviceList:
    """All GPUs, or `[cpu]` when there are none (never an empty list)."""
    n = gpu_count()
    if n == 0:
        return DeviceList([torch.device("cpu")])
    return DeviceList(torch.device(f"cuda:{i}") for i in range(n))


def place(n: int, gpus: int, kind: str = "auto") -> DeviceList:
    """The n devices a run of n gets on a machine with `gpus` CUDA devices: a pure rule, the same
    for every strategy (tested against simulated GPU counts, correctness/test_devices.py).

    kind "auto": n GPUs when there are that many, else n emulated devices on the CPU;
    "cpu": n devices on the CPU whatever the GPUs (what a comparison with a CPU run needs);
    "cuda": n GPUs, a DeviceError when there are fewer.
    """
    if not isinstance(n, int) or isinstance(n, bool):
        raise ConfigError(f"number of devices must be an integer, got {n!r}")
    if n < 1:
        raise ConfigError(f"number of devices must be at least 1, got {n}")
    if kind not in DEVICE_KINDS:
        raise ConfigError(f"device kind must be one of {', '.join(DEVICE_KINDS)}, got {kind!r}")
    if kind == "cuda" and gpus < n:
        raise DeviceError(f"{n} GPU(s) demanded but {gpus} CUDA device(s) found")
    if kind == "cpu" or gpus < n:
        # One CPU device needs no emulation; two or more are replicas (or ranks) sharing the CPU.
        return DeviceList([torch.device("cpu")] * n, emulated=n > 1)
    return DeviceList((torch.device(f"cuda:{i}") for i in range(n)), emulated=False)


def devices(n: int, require_gpus: bool = False, kind: str = "auto") -> DeviceList:
    """n devices on this machine (`place` with its GPU count): n real GPUs when there are that many,
    else n emulated devices on the CPU; kind "cpu" keeps them on the CPU.

    Raises ConfigError for n < 1, and DeviceError when `require_gpus` is set (or kind is "cuda")
    and fewer than n GPUs exist.
    """
    if require_gpus and kind == "cpu":
        raise ConfigError("require_gpus (--require-gpus) and device cpu (--device cpu) contradict each other: give one")
    return place(n, gpu_count(), "cuda" if require_gpus else kind)


def rank_placement(local_rank: int, local_world_size: int, gpus: int, kind: str = "auto") -> tuple[torch.device, str]:
    """(device, process-group backend) of one rank: cuda:LOCAL_RANK and nccl when this machine has a
    GPU for every local rank, else the CPU and gloo for all of them (mixing nccl and gloo ranks in
    one group cannot work, and NCCL refuses two ranks on one GPU). kind as for `place`."""
    device = place(local_world_size, gpus, kind)[local_rank]
    return device, "nccl" if device.type == "cuda" else "gloo"


def shared_gpus(placements: list[tuple[str, str]]) -> list[tuple[int, int, str]]:
    """(rank, rank, device) for every two ranks given the same GPU of the same host, from each rank's
    (host, device): what NCCL would refuse at its first collective ("Duplicate GPU detected"), found
    before it. Two torchrun agents on one machine with one GPU each count one local rank apiece, so
    each takes cuda:0."""
    first: dict[tuple[str, str], int] = {}
    clashes = []
    for rank, (host, device) in enumerate(placements):
        if not str(device).startswith("cuda"):
            continue
        if (host, device) in first:
            clashes.append((first[host, device], rank, device))
        else:
            first[host, device] = rank
    return clashes


def comparison_kind(max_devices: int, gpus: int) -> str:
    """The one device kind for a comparison whose runs use up to `max_devices` devices (or ranks):
    "cuda" when the GPUs suffice for its largest run, else "cpu" for all of them, the one-device
    reference included. Comparing a GPU reference with emulated CPU devices would measure the
    difference between two kinds of hardware, not data parallelism."""
    return "cuda" if gpus >= max_devices else "cpu"


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """`t` on `device` without making the host wait for the device.

    Host to GPU: through pinned (page-locked) memory with non_blocking=True, so the copy is queued
    on the device's stream like a kernel; an ordinary copy from pageable memory would block the
    host until the device has caught up. GPU to GPU copies are queued anyway. On the CPU: `t` itself.
    """
    device = torch.device(device)
    if device.type != "cuda" or t.device == device:
        return t.to(device)
    if t.device.type == "cpu":
        t = t if t.is_pinned() else t.pin_memory()
    return t.to(device, non_blocking=True)


def supports_bf16(device) -> bool:
    """Whether autocast to bfloat16 runs on this device (CPUs: always; GPUs: compute capability 8.0+)."""
    device = torch.device(device)
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)


def check_amp(amp: str, devices) -> None:
    """DeviceError when --amp bf16 is asked for on a device without bfloat16 support."""
    if amp == "bf16":
        for device in dict.fromkeys(devices):
            if not supports_bf16(device):
                raise DeviceError(f"--amp bf16 needs bfloat16 support, which {device} lacks: use --amp off")


def free_memory(device) -> int:
    """Bytes free on a CUDA device (the driver's figure)."""
    return torch.cuda.mem_get_info(torch.device(device))[0]


def check_fits(nbytes: int, device, what: str = "the dataset") -> None:
    """DeviceError when `nbytes` would not fit in the device's free memory (CUDA only; the CPU always
    holds what is already in memory)."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    free = free_memory(device)
    if nbytes > free:
        raise DeviceError(f"{what} ({nbytes / 2**20:.0f} MiB) does not fit in {device}'s free memory "
                          f"({free / 2**20:.0f} MiB): leave out --data-on-device")


def synchronize(devs) -> None:
    """Wait for every queued kernel on each CUDA device in `devs`; a no-op for CPU devices."""
    for d in {torch.device(d) for d in devs}:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def describe(devs) -> str:
    """Device list as printed at the end of a run, emulated devices labelled as such."""
    emulated = getattr(devs, "emulated", False)
    devs = [torch.device(d) for d in devs]
    if emulated or (len(devs) > 1 and all(d.type == "cpu" for d in devs)):
        return "[" + ", ".join(f"cpu (emulated {i})" for i in range(len(devs))) + "]"
    return "[" + ", ".join(repr(d) for d in devs) + "]"


# -- CPU processes -------------------------------------------------------------------------------

def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no affinity, assume every core
        return list(range(os.cpu_count() or 1))


_EXACT_FLAGS = ((torch.backends.cuda.matmul, "allow_tf32", False), (torch.backends.cudnn, "allow_tf32", False),
                (torch.backends.cudnn, "deterministic", True), (torch.backends.cudnn, "benchmark", False))


def set_exact_gpu_math(settings: list | None = None) -> list:
    """GPU math that another run can be compared with, for the rest of the process: TF32 off (full
    fp32 matmuls and convolutions) and cuDNN's deterministic algorithms, no autotuning. cuDNN's
    default weight gradients sum in an order that may change between runs (docs/notes/gpu-runs.md has what
    that did on an H200). No effect on the CPU, whose kernels are deterministic already. Returns the
    settings it replaced; `set_exact_gpu_math(those)` puts them back."""
    saved = [getattr(owner, name) for owner, name, _ in _EXACT_FLAGS]
    wanted = [exact for _, _, exact in _EXACT_FLAGS] if settings is None else settings
    for (owner, name, _), value in zip(_EXACT_FLAGS, wanted):
        setattr(owner, name, value)
    return saved


@contextlib.contextmanager
def exact_gpu_math():
    """set_exact_gpu_math() for the block; the settings from before it given back after it."""
    saved = set_exact_gpu_math()
    try:
        yield
    finally:
        set_exact_gpu_math(saved)


@contextlib.contextmanager
def torch_threads(n: int | None = None):
    """torch's intra-op thread count set to `n` for the block (None: left as it is), and the count
    from before the block given back after it, whatever the block set meanwhile (a DDP strategy's
    create() sets its own)."""
    saved = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


