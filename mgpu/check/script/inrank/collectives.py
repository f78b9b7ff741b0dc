"""Inside a rank: the collectives that autograd does not see, called on a tensor that requires grad.

torch.distributed's `all_gather`, `all_gather_into_tensor`, `all_reduce`, `broadcast`, `reduce`,
`reduce_scatter`, `reduce_scatter_tensor` and `all_to_all_single` are not differentiable: what they
return, or write in place, is a constant to autograd. Called inside a training step on a tensor that
requires grad (the usual contrastive-loss bug: `dist.all_gather` of the embeddings, so that the
gradient of the loss for the other ranks' examples never comes back to this rank's), the gradients
at world N lack terms that world 1 has, and the two part with no common factor.
`torch.distributed.nn.functional` holds the differentiable versions (WATCHED names each; the judge's
causes/collectives.py words the finding and the fix).

    watch = CollectiveWatch(in_step=lambda: bool(recorder.pending))   # the Recorder installs one
    watch.install(); ...; watch.uninstall()
    watch.calls()    # [CollectiveCall(op="all_gather", where="train.py:42", calls=4)]

A call counts when grad mode is on, outside backward, inside a training step (a root model's
training forward since the last optimizer step: `in_step`), a tensor it is given requires grad, and
its caller is not torch itself (torch.distributed.nn.functional calls them with grad mode off, in
its autograd Functions; DDP and FSDP call them on buffers that need no gradient). The wrapped
functions are those of the `torch.distributed` namespace, which scripts call (`dist.all_gather`).
"""

from __future__ import annotations

import collections
import functools
import os
import sys

import torch

from mgpu.check.script.inrank.records import CollectiveCall

__all__ = ["CollectiveWatch", "WATCHED"]

# torch.distributed's collectives that bypass autograd -> torch.distributed.nn.functional's version.
WATCHED = {
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "all_reduce": "all_reduce",
    "broadcast": "broadcast", "reduce": "reduce", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all_single",
}
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_MGPU_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _needs_grad(args, kwargs) -> bool:
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in items):
            return True
    return False


def _site(path: str, line: int) -> str:
    rel = os.path.relpath(path)
    return f"{path if rel.startswith('..') else rel}:{line}"


def _call_site(frame) -> str | None:
    """The caller's file:line, and the script's own line that led there when the caller is a library
    ("lib/losses.py:12 (from train.py:88)"); None when torch itself called (its own use, not the script's)."""
    caller = frame
    while caller is not None and caller.f_code.co_filename.startswith(_MGPU_DIR):
        caller = caller.f_back
    if caller is None or caller.f_code.co_filename.startswith(_TORCH_DIR):
        return None
    where = _site(caller.f_code.co_filename, caller.f_lineno)
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    outer = caller
    while outer is not None and os.path.abspath(outer.f_code.co_filename) != script:
        outer = outer.f_back
    if outer is not None and outer is not caller:
        where += f" (from {_site(outer.f_code.co_filename, outer.f_lineno)})"
    return where


class CollectiveWatch:
    """Wraps torch.distributed's collectives (WATCHED) while installed; counts the calls, by op and
    call site, that autograd cannot follow back (the module docstring's rule)."""

    def __init__(self, in_step):
        self.in_step = in_step
        self.seen: collections.Counter = collections.Counter()   # (op, where) -> calls
        self.originals: dict = {}

    def install(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        for op in WATCHED:
            original = getattr(dist, op, None)
            if original is not None and op not in self.originals:
                self.originals[op] = original
                setattr(dist, op, self._wrap(op, original))

    def uninstall(self) -> None:
        import torch.distributed as dist

        for op, original in self.originals.items():
            setattr(dist, op, original)
        self.originals = {}

    def _wrap(self, op: str, original):
        @functools.wraps(original)
        def watched(*args, **kwargs):
            if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1 and _needs_grad(args, kwargs) \
                    and self.in_step():
                where = _call_site(sys._getframe(1))
                if where is not None:
                    self.seen[(op, where)] += 1
            return original(*args, **kwargs)

        return watched

    def calls(self) -> list[CollectiveCall]:
        return [CollectiveCall(op, where, n) for (op, where), n in self.seen.items()]
