"""What a training step does, counted: exact figures with no noise, beside the timed ones.

    counts = count_step(session.step)              # one extra step, outside the timing, after warm-up
    ranks = count_session(session, session.step)   # each rank's counts (StepCounts.to_dict), in rank order

Two steps' counts are compared, and judged, in counts/judge.py.

A step's counts (`StepCounts`) come from one run of it under a `TorchDispatchMode`, which sees
every aten op the step dispatches, the collectives (`c10d.allreduce_`, DDP's C++ reducer
included) and the host reads (`aten._local_scalar_dense`: `.item()`, `float(t)`, `print(loss)`;
and copies from a GPU to the host), with torch's `FlopCounterMode` for the FLOPs of matmuls and
convolutions. What is counted:

* `ops`: aten ops by name and count (views and metadata ops included: a changed op count alone
  is reported, never failed);
* `flops`: FLOPs, as FlopCounterMode counts them;
* `allocated_bytes`: bytes of the new tensors the step's ops return (views and in-place ops
  return none); an extra copy (`.contiguous()`, a dtype cast) or a float64 layer raises it;
* `written_bytes`: bytes the step's in-place and `out=` ops write into tensors that exist
  (`zero_`, `copy_`, an optimizer's `add_`): `zero_grad(set_to_none=False)` raises it;
* `collectives`: by kind, with count and bytes (the tensors handed to the collective);
* `host_reads`: reads of a tensor's value by the host, each a device sync on a GPU: counted where
  Python makes them (`.item()`, `.tolist()`, `float(t)`, `if t:`, `print(t)`, `np.asarray(t)`,
  through a TorchFunctionMode, since on a CPU tensor `.tolist()` dispatches no op), and at dispatch
  for a copy from a GPU to the host, a read made inside an op (`torch.equal`, `allclose`), and an op
  whose output's size comes from the values (`nonzero`, `t[mask]`, `unique`);
* `storage_reads`: tensors whose storage Python took hold of (`Tensor.untyped_storage()`, which
  `torch.save` and pickling call for every tensor they write): a checkpoint saved every step
  raises it, where no aten op runs on a CPU;
* `compile`: under torch.compile, the graphs compiled and the graph breaks (by reason) since
  the workload began, and graphs compiled during the counted step (a recompile at steady state);
* `cuda`, in a process that uses a GPU: kernels launched (torch.profiler) and the step's peak of
  allocated memory. Both are reported, not failed: a kernel count follows cuBLAS's and cuDNN's
  choices, which another library version may change with no change to the code.

Every count is a property of the code and the shapes, so two runs of the same tree give the same
counts. Where a figure is not (the caching allocator's peak, which depends on what the process
allocated before), it is not counted.

Recomputation is counted: activation checkpointing (`torch.utils.checkpoint`, reentrant or not)
runs a region's forward again in the backward with the dispatch modes on, so its ops, FLOPs and
bytes are the step's (mgpu_perf_tests/test_recomputation.py). torch.profiler shows one call more
than runs: non-reentrant checkpointing stops recomputing once the last tensor the backward needs is
saved again, which an op does before its kernel runs; a region of one convolution is recorded as an
`aten::convolution` whose kernel (`aten::_convolution`) never runs. That is no work, and not counted.
"""

from __future__ import annotations

import dataclasses
import gc
from collections import Counter
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["StepCounts", "CompileWatch", "count_step", "count_session", "readable_size"]

_HOST_READ_OPS = {"aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal", "aten.allclose"}
# Ops whose output's shape depends on the values: on a GPU the host waits for the count to size it.
_SHAPE_FROM_VALUES_OPS = {"aten.nonzero", "aten.argwhere", "aten.masked_select", "aten._unique", "aten._unique2",
                          "aten.unique_dim", "aten.unique_consecutive", "aten.unique_dim_consecutive", "aten.bincount"}
_INDEX_OPS = {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}
# Tensor methods that hand a value to Python. On a CPU tensor some dispatch no aten op at all
# (`.tolist()`, `.numpy()`, `print(t)` by way of __repr__), so they are counted where Python calls them.
_HOST_READ_METHODS = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__complex__",
                      "__repr__", "__str__", "__format__", "__array__", "__contains__"}


@dataclasses.dataclass
class StepCounts:
    ops: dict[str, int]
    flops: int
    allocated_bytes: int
    collectives: dict[str, dict[str, int]]  # kind -> {"count": n, "bytes": b}
    host_reads: int
    compile: dict[str, Any] | None = None   # {"graphs": n, "graph_breaks": {reason: n}, "recompiles": n}
    written_bytes: int = 0                  # by in-place and out= ops, into tensors that exist
    cuda: dict[str, int] | None = None      # on a GPU: {"kernels": launches, "peak_bytes": the step's peak}
    storage_reads: int = 0                  # tensors whose storage Python took (torch.save, pickling)

    @property
    def collective_calls(self) -> int:
        return sum(c["count"] for c in self.collectives.values())

    @property
    def collective_bytes(self) -> int:
        return sum(c["bytes"] for c in self.collectives.values())

    @property
    def graph_breaks(self) -> int:
        return sum((self.compile or {}).get("graph_breaks", {}).values())

    @property
    def recompiles(self) -> int:
        return (self.compile or {}).get("recompiles", 0)

    @property
    def kernels(self) -> int:
        return (self.cuda or {}).get("kernels", 0)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "StepCounts":
        return cls(**d)

    def figures(self) -> dict:
        """The guarded counts as numbers: what the perf suite stores in each benchmark's extra_info."""
        out = {"flops": self.flops, "allocated_bytes": self.allocated_bytes, "written_bytes": self.written_bytes,
               "collectives": self.collective_calls,
               "collective_bytes": self.collective_bytes, "host_reads": self.host_reads,
               "storage_reads": self.storage_reads, "aten_ops": sum(self.ops.values())}
        if self.compile is not None:
            out.update(graphs=self.compile.get("graphs", 0), graph_breaks=self.graph_breaks)
        if self.cuda is not None:
            out.update(cuda_kernels=self.kernels, cuda_peak_bytes=self.cuda.get("peak_bytes"))
        return out

    def summary(self) -> str:
        """One line: what bench prints per strategy."""
        return (f"{self.flops / 1e9:.3g} GFLOP, {readable_size(self.allocated_bytes)} allocated, "
                f"{self.collective_calls} collective(s) ({readable_size(self.collective_bytes)}), "
                f"{self.host_reads} host read(s)")


class _HostReads(TorchFunctionMode):
    """Reads of a tensor's value by Python (`.item()`, `.tolist()`, `float(t)`, `if t:`, `print(t)`):
    one each, whatever aten ops they dispatch (the step counter leaves those out while one runs).
    Also the tensors whose storage Python takes (`storages`): torch.save's and pickling's way in."""

    def __init__(self):
        super().__init__()
        self.count, self.inside, self.storages = 0, 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "untyped_storage":
            self.storages += 1
        if name not in _HOST_READ_METHODS:
            return func(*args, **(kwargs or {}))
        self.count += 1
        self.inside += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.inside -= 1


class _NoHostReads:
    count, inside, storages = 0, 0, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class _StepCounter(TorchDispatchMode):
    def __init__(self, python_reads=None):
        super().__init__()
        self.ops, self.allocated, self.written, self.host_reads = Counter(), 0, 0, 0
        self.collectives: dict[str, dict[str, int]] = {}
        self.python_reads = python_reads or _NoHostReads()  # reads counted where Python made them

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        self.ops[name] += 1
        out = func(*args, **kwargs)
        if name.startswith("c10d."):
            entry = self.collectives.setdefault(name.removeprefix("c10d."), {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += sum(t.numel() * t.element_size() for t in _tensors((args, kwargs)))
        elif not self.python_reads.inside and (name in _HOST_READ_OPS or _shape_from_values(func, name, args, kwargs)
                                               or _is_copy_to_host(name, args, kwargs, out)):
            self.host_reads += 1  # .cpu() of a GPU tensor, a read made inside an op (C++'s .item()), t[mask]
        if not name.startswith("c10d."):
            if func._schema.is_mutable:
                self.written += sum(t.numel() * t.element_size() for t in _tensors(_written_args(func, args, kwargs)))
            elif not _is_view_or_inplace(func):
                self.allocated += sum(t.numel() * t.element_size() for t in _tensors(out))
        return out


def _tensors(tree) -> list[torch.Tensor]:
    flat, _ = torch.utils._pytree.tree_flatten(tree)
    seen, out = set(), []
    for t in flat:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _written_args(func, args, kwargs) -> list:
    """The arguments an in-place or out= op writes into (`Tensor(a!)` in its schema)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written.append(args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name))
    return written


def _is_view_or_inplace(func) -> bool:
    schema = func._schema
    return any(a.alias_info is not None for a in schema.returns) or schema.is_mutable


def _shape_from_values(func, name: str, args, kwargs) -> bool:
    """An op whose output's size is read from the values (nonzero, `t[mask]`, `t[mask] = v`, unique,
    repeat_interleave without output_size): a sync on a GPU, though it returns a tensor."""
    if name in _SHAPE_FROM_VALUES_OPS:
        return True
    if name in _INDEX_OPS and len(args) > 1 and isinstance(args[1], (list, tuple)):
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])
    if name == "aten.repeat_interleave":
        repeats = args[0] if func._overloadname == "Tensor" else args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


def _is_copy_to_host(name: str, args, kwargs, out) -> bool:
    """A device -> host copy (`.cpu()`, `.to("cpu")`, `.tolist()` by way of it): a sync on a GPU."""
    if name not in ("aten._to_copy", "aten.copy_") or not args or not isinstance(args[0], torch.Tensor):
        return False
    src = args[1] if name == "aten.copy_" and len(args) > 1 else args[0]
    dst = out if isinstance(out, torch.Tensor) else args[0]
    return isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst.device.type == "cpu"


class CompileWatch:
    """torch._dynamo's counters from a workload's start: graphs compiled and graph breaks by reason."""

    def __init__(self):
        self.start = self._snapshot()

    @staticmethod
    def _snapshot() -> dict:
        try:
            from torch._dynamo.utils import counters
        except ImportError:  # a torch without dynamo
            return {"graphs": 0, "breaks": Counter()}
        breaks = Counter()
        for reason, n in counters["graph_break"].items():
            breaks[_short_reason(reason)] += n
        return {"graphs": counters["stats"]["unique_graphs"], "breaks": breaks}

    def since_start(self, before_step: dict | None = None) -> dict:
        now = self._snapshot()
        breaks = now["breaks"] - self.start["breaks"]
        return {"graphs": now["graphs"] - self.start["graphs"], "graph_breaks": dict(sorted(breaks.items())),
                "recompiles": now["graphs"] - before_step["graphs"] if before_step else 0}


def _short_reason(reason: str) -> str:
    """A graph break's reason in one line: its title and explanation, without dynamo's hints."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()][:2]
    return ": ".join(ln.removeprefix("Explanation: ") for ln in lines)[:200] or "?"


def count_step(step: Callable[[], Any], compile_watch: CompileWatch | None = None,
               collect_garbage: bool = True) -> StepCounts:
    """Run `step()` once under the counters (outside any timing) and return what it did.
    `compile_watch`: the workload's CompileWatch when its model is compiled. `collect_garbage`: a full
    gc pass after (0.1 s with dynamo loaded) for the timed rounds that follow; False where none do."""
    from torch.utils.flop_counter import FlopCounterMode

    before = compile_watch._snapshot() if compile_watch else None
    # Under torch.compile a function mode would be part of what dynamo guards on (a recompile in the
    # counted step); reads there are graph breaks, and dispatch shows them.
    python_reads = _NoHostReads() if compile_watch else _HostReads()
    counter = _StepCounter(python_reads)
    flops = FlopCounterMode(display=False)
    with _CudaCounts() as cuda, flops, counter, python_reads:
        step()
    if collect_garbage:
        gc.collect()  # the counters' garbage now, not in the rounds timed after them
    return StepCounts(ops=dict(sorted(counter.ops.items())), flops=int(flops.get_total_flops()),
                      allocated_bytes=int(counter.allocated), written_bytes=int(counter.written), collectives=dict(sorted(counter.collectives.items())),
                      host_reads=counter.host_reads + python_reads.count, storage_reads=python_reads.storages,
                      compile=compile_watch.since_start(before) if compile_watch else None, cuda=cuda.result)


def count_session(session, step: Callable[[], Any], compile_watch: CompileWatch | None = None,
                  collect_garbage: bool = True) -> list[dict]:
    """One step of a harness session counted: each rank's counts (StepCounts.to_dict). A rank pool
    counts in every rank (`count_step`); a session in this process runs `step` under the counters."""
    if hasattr(session, "count_step"):
        return session.count_step(collect_garbage)
    return [count_step(step, compile_watch, collect_garbage).to_dict()]


class _CudaCounts:
    """In a process that uses a GPU: the kernels the step launches (torch.profiler's CUDA activity,
    copies and memsets left out) and the step's peak of allocated memory above what it began with."""

    def __init__(self):
        self.on = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.result = None

    def __enter__(self):
        if self.on:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self.profiler.__enter__()
        return self

    def __exit__(self, *exc):
        if not self.on:
            return
        torch.cuda.synchronize()
        self.profiler.__exit__(*exc)
        if exc[0] is None:
            kernels = [e for e in self.profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA
                       and not e.name.lower().startswith(("memcpy", "memset"))]
            self.result = {"kernels": len(kernels), "peak_bytes": torch.cuda.max_memory_allocated() - self.start}


def readable_size(n: int) -> str:
    """Bytes in the unit that keeps three figures: `2.3 MB`, `512 B` (the summary's and the changes' words)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"
