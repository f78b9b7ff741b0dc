"""Inside a rank, under `mgpu check-script --whole-run`: what the script's evaluation and the figures it reports
rest on, on one event clock, so that the judge can tell which collective came between an evaluation pass
and the line that printed its figure.

    watch = EvalWatch(rank); watch.install()     # the Recorder's; EpochWatch(clock=watch.tick, digest=batch_digests)
    ...; watch.uninstall(); watch.into(record)  # the RankRecord's collectives_seen, printed, saves, optimizer_state

**The clock** (`tick`): one counter a rank, read at each DataLoader batch (EpochPass.started / ended), each
collective, each line written and each save.

**Collectives** (`CollectiveSeen`): torch.distributed's data collectives (`all_reduce`, `all_gather`,
`reduce`, `broadcast`, `gather`, the `_object` ones ...) the script calls (not torch's own calls): the op,
the reduction, the script's line, the tensor's id (one accumulator reduced twice is one id), and for a
tensor of at most SMALL elements its values before and after (the per-rank figures a mean of means
averages). A call with `async_op=True` keeps no values after (they are not there yet).

**Lines** (`PrintedLine`, rank 0): sys.stdout and sys.stderr are wrapped (print, logging's StreamHandler
made by the script, tqdm); each line once complete, the last '\\r' segment of it (a progress bar's last state).
TensorBoard's `SummaryWriter.add_scalar` (once the script imported torch.utils.tensorboard) gives a line
"tag: value" of a stream of its own.

**Saves** (`SaveCall`): `torch.save` and torch.distributed.checkpoint's `save` / `save_state_dict` /
`async_save` (wrapped once the script has imported it: the clock looks), with the path, the line, and
whether the object holds an optimizer's state or a model's weights. accelerate's `gather_for_metrics`
(where the script imported accelerate) is counted on the clock: it drops the padding of the last batch.
The optimizers that step are looked at: those holding state (momentum, moments) are named.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
import sys
import threading

import torch

from mgpu.check.script.inrank.records import CollectiveSeen, PrintedLine, SaveCall

__all__ = ["EvalWatch", "batch_digests", "SMALL", "DATA_COLLECTIVES"]

SMALL = 16             # a collective's tensor kept as values up to this many elements
MOST_EVENTS = 4096     # collectives, lines and saves kept a rank
LINE_CHARS = 400
DATA_COLLECTIVES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "gather",
                    "gather_object", "broadcast", "broadcast_object_list", "reduce_scatter", "reduce_scatter_tensor",
                    "all_to_all_single")
_REDUCING = {"all_reduce": 1, "reduce": 2, "reduce_scatter": 2, "reduce_scatter_tensor": 2}  # op's position
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_MGPU = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep
_DCP = ("save", "save_state_dict", "async_save")


def batch_digests(data, most: int = 4096) -> list[str]:
    """A digest of each example of a batch: a hash of the bytes of its first tensor's row (the first `most`
    elements of it), exact and independent of the batch it came in. No random numbers drawn."""
    import hashlib

    t = _first_tensor(data, 0)
    if t is None or t.dim() == 0 or t.shape[0] == 0:
        return []
    with torch.no_grad():
        rows = t.detach().reshape(t.shape[0], -1)[:, :most].to("cpu").contiguous()
        if rows.dtype == torch.bool:
            rows = rows.to(torch.uint8)
        raw = rows.view(torch.uint8).numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in raw]


def _first_tensor(data, depth: int):
    if isinstance(data, torch.Tensor):
        return data
    if depth > 3:
        return None
    # a dict, or a Mapping that is not one (HF's BatchEncoding is a UserDict)
    items = data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def _holds(obj) -> tuple[bool, bool]:
    """(an optimizer's state, a model's weights) within obj: a state_dict of an optimizer ("state" and
    "param_groups") or an Optimizer; a Module, or a dict with tensors among its values (a state_dict)."""
    from torch import nn

    optimizer = weights = False
    stack, looked = [(obj, 0)], 0
    while stack and looked < 2000:
        o, depth = stack.pop()
        looked += 1
        if isinstance(o, torch.optim.Optimizer):
            optimizer = True
        elif isinstance(o, nn.Module):
            weights = True
        elif isinstance(o, dict):
            if "state" in o and "param_groups" in o:
                optimizer = True
                continue
            if any(isinstance(v, torch.Tensor) for v in o.values()):
                weights = True
            if depth < 4:
                stack.extend((v, depth + 1) for v in o.values())
        elif isinstance(o, (list, tuple)) and depth < 4:
            stack.extend((v, depth + 1) for v in o)
    return optimizer, weights


def _script_line(frame) -> str | None:
    """The caller's line past mgpu's frames; None where torch itself called (its own use, not the script's)."""
    from mgpu.check.script.inrank.epochs import made_at

    while frame is not None and frame.f_code.co_filename.startswith(_MGPU):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith(_TORCH):
        return None
    return made_at(frame)


def _values(t) -> tuple:
    """A small tensor's values (or a list of them, or of numbers: an `_object` collective's), else ()."""
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return (float(t),)
    if isinstance(t, (list, tuple)) and t and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in t):
        return tuple(float(x) for x in t) if len(t) <= SMALL else ()
    if isinstance(t, (list, tuple)):
        parts = [x for x in t if isinstance(x, torch.Tensor)]
        if not parts or sum(x.numel() for x in parts) > SMALL:
            return ()
        return tuple(v for x in parts for v in _values(x))
    if not isinstance(t, torch.Tensor) or t.numel() > SMALL or t.is_complex():
        return ()
    return tuple(float(v) for v in t.detach().reshape(-1).to("cpu", torch.float64).tolist())


def _reduce_name(op: str, args, kwargs) -> str:
    if op not in _REDUCING:
        return ""
    red = kwargs.get("op", args[_REDUCING[op]] if len(args) > _REDUCING[op] else None)
    if red is None:
        return "SUM"
    name = getattr(red, "name", None)
    return name if isinstance(name, str) else str(red).rsplit(".", 1)[-1]


def _given(op: str, args, kwargs):
    """(the tensor the rank gives, where the result lands) of a collective call."""
    if op in ("all_gather_object", "gather_object"):
        obj = args[1] if len(args) > 1 else kwargs.get("obj")
        out = args[0] if args else kwargs.get("object_list", kwargs.get("object_gather_list"))
        if op == "gather_object":
            obj, out = (args[0] if args else kwargs.get("obj")), (args[1] if len(args) > 1 else kwargs.get("object_gather_list"))
        return obj, out
    if op in ("all_gather", "all_gather_into_tensor"):
        given = args[1] if len(args) > 1 else kwargs.get("tensor", kwargs.get("input_tensor"))
        out = args[0] if args else kwargs.get("tensor_list", kwargs.get("output_tensor"))
        return given, out
    t = args[0] if args else kwargs.get("tensor")
    return t, t


class _Tee:
    """A text stream that records what passes through it, whole lines, and writes it on to the stream it wraps."""

    def __init__(self, inner, name: str, sink):
        self._inner, self._name, self._sink, self._part = inner, name, sink, ""

    def write(self, text):
        n = self._inner.write(text)
        try:
            if isinstance(text, str):
                *lines, self._part = (self._part + text).split("\n")
                for line in lines:
                    self._sink(self._name, line)
                self._part = self._part[-4 * LINE_CHARS:]
        except Exception:  # the record never costs the script its output
            pass
        return n

    def close_part(self) -> None:
        if self._part.strip():
            self._sink(self._name, self._part)
        self._part = ""

    def __getattr__(self, name):
        return getattr(self._inner, name)


class EvalWatch:
    """The module docstring's clock, collectives, lines and saves, in one rank."""

    def __init__(self, rank: int):
        self.rank = rank
        self.seq = 0
        self.number = 0
        self.collectives: list[CollectiveSeen] = []
        self.printed: list[PrintedLine] = []
        self.saves: list[SaveCall] = []
        self.gathered: list[int] = []      # the clock at each gather_for_metrics call
        self.stateful: dict = {}           # id(optimizer) -> its class, once it holds state (looked at each step)
        self.saved: list = []              # (owner, name, original) to put back
        self.tees: list = []
        self.depth = threading.local()
        self.modules = 0
        self.handle = None

    def tick(self) -> int:
        self.seq += 1
        if len(sys.modules) != self.modules:  # the script imported something: torch.distributed.checkpoint?
            self.modules = len(sys.modules)
            self._late()
        return self.seq

    # -- install ---------------------------------------------------------------------------------------

    def install(self) -> None:
        import torch.distributed as dist
        from torch.optim import optimizer

        self._put(torch, "save", self._save("torch.save", torch.save))
        if dist.is_available():
            for op in DATA_COLLECTIVES:
                if getattr(dist, op, None) is not None:
                    self._put(dist, op, self._collective(op, getattr(dist, op)))
        self.handle = optimizer.register_optimizer_step_post_hook(self._stepped)
        if self.rank == 0:
            for name in ("stdout", "stderr"):
                tee = _Tee(getattr(sys, name), name, self._line)
                self.tees.append(tee)
                setattr(sys, name, tee)
        self._late()

    def uninstall(self) -> None:
        for tee in self.tees:
            tee.close_part()
            if getattr(sys, tee._name) is tee:
                setattr(sys, tee._name, tee._inner)
        self.tees = []
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved = []
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _put(self, owner, name: str, wrapper) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def _late(self) -> None:
        """Wrap what the script imported since: torch.distributed.checkpoint's saves, accelerate's gather_for_metrics."""
        dcp = sys.modules.get("torch.distributed.checkpoint")
        if dcp is not None and not any(owner is dcp for owner, _, _ in self.saved):
            for name in _DCP:
                if callable(getattr(dcp, name, None)):
                    self._put(dcp, name, self._save("dcp", getattr(dcp, name)))
        tb = sys.modules.get("torch.utils.tensorboard.writer")
        writer = getattr(tb, "SummaryWriter", None) if tb is not None else None
        if writer is not None and self.rank == 0 and not any(owner is writer for owner, _, _ in self.saved):
            self._put(writer, "add_scalar", self._scalar(writer.add_scalar))
        acc = sys.modules.get("accelerate")
        accelerator = getattr(acc, "Accelerator", None) if acc is not None else None
        if accelerator is not None and not any(owner is accelerator for owner, _, _ in self.saved):
            original = accelerator.gather_for_metrics
            watch = self

            @functools.wraps(original)
            def gather_for_metrics(*args, **kwargs):
                watch.gathered.append(watch.tick())
                return original(*args, **kwargs)
            self._put(accelerator, "gather_for_metrics", gather_for_metrics)

    # -- the wrappers ------------------------------------------------------------------------------------

    def _stepped(self, opt, args, kwargs) -> None:
        """An optimizer stepped: once it holds state (gone with the script's objects by the end), it is named."""
        if id(opt) not in self.stateful and _has_state(opt):
            self.stateful[id(opt)] = type(opt).__name__

    def _line(self, stream: str, text: str) -> None:
        text = text.rsplit("\r", 1)[-1].rstrip()
        if text and len(self.printed) < MOST_EVENTS:
            self.printed.append(PrintedLine(self.tick(), stream, text[:LINE_CHARS]))

    def _scalar(self, original):
        """TensorBoard's SummaryWriter.add_scalar: a line "tag: value" of its own stream, read as a printed one."""
        watch = self

        @functools.wraps(original)
        def add_scalar(writer, tag, scalar_value, *args, **kwargs):
            try:
                watch._line("tensorboard", f"{tag}: {float(scalar_value)!r}")
            except Exception:  # a value that is no number: not a figure
                pass
            return original(writer, tag, scalar_value, *args, **kwargs)
        return add_scalar

    def _collective(self, op: str, original):
        watch = self

        @functools.wraps(original)
        def seen(*args, **kwargs):
            if getattr(watch.depth, "value", 0):  # inside another collective (all_gather_object's all_gather)
                return original(*args, **kwargs)
            where = _script_line(sys._getframe(1))
            if where is None:
                return original(*args, **kwargs)
            given, out = _given(op, args, kwargs)
            before = _values(given)
            watch.depth.value = 1
            try:
                result = original(*args, **kwargs)
            finally:
                watch.depth.value = 0
            watch.number += 1
            if len(watch.collectives) < MOST_EVENTS:
                after = () if kwargs.get("async_op") else _values(out)
                numel = given.numel() if isinstance(given, torch.Tensor) else 0
                watch.collectives.append(CollectiveSeen(watch.tick(), watch.number, op, _reduce_name(op, args, kwargs),
                                                        where, id(given) if given is not None else 0, numel, before,
                                                        after))
            return result
        return seen

    def _save(self, how: str, original):
        watch = self

        @functools.wraps(original)
        def save(*args, **kwargs):
            try:
                watch._saved(how, args, kwargs, sys._getframe(1))
            except Exception:  # an object that resists being looked at: the save goes on unrecorded
                pass
            return original(*args, **kwargs)
        return save

    def _saved(self, how: str, args, kwargs, frame) -> None:
        where = _script_line(frame)
        if where is None or len(self.saves) >= MOST_EVENTS:
            return
        obj = args[0] if args else kwargs.get("obj", kwargs.get("state_dict"))
        if how == "torch.save":
            f = args[1] if len(args) > 1 else kwargs.get("f")
        else:
            f = kwargs.get("checkpoint_id") or getattr(kwargs.get("storage_writer"), "path", None)
        if isinstance(f, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(f))
        elif isinstance(getattr(f, "name", None), str) and os.path.isabs(f.name):
            path = f.name   # an open file
        else:
            path = ""       # a buffer
        optimizer, weights = _holds(obj)
        self.saves.append(SaveCall(self.tick(), how, path, where, optimizer, weights))

    # -- the record --------------------------------------------------------------------------------------

    def epoch_watch(self, epoch_steps: int, batches: list):
        """The EpochWatch of the rank (epochs.py), its passes on this clock, its evaluations' examples digested."""
        from mgpu.check.script.inrank.epochs import EpochWatch

        return EpochWatch(epoch_steps, batches, self.tick, batch_digests)

    def into(self, record, switches=()) -> None:
        """The RankRecord's fields (and the EpochWatch's `switches`); each gather_for_metrics call counted on the
        pass it fell in."""
        record.collectives_seen, record.printed, record.saves = self.collectives, self.printed, self.saves
        record.switches = list(switches)
        record.optimizer_state = sorted(set(self.stateful.values()))
        for seq in self.gathered:
            inside = [p for p in record.passes if p.started and p.started <= seq]
            if inside:
                max(inside, key=lambda p: p.started).gathered += 1


def _has_state(optimizer) -> bool:
    """An optimizer holding state a resume needs (momentum, Adam's moments): some value that is not None."""
    try:
        return any(v is not None for s in optimizer.state.values() for v in s.values())
    except Exception:
        return False
