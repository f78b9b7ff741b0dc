"""Inside a rank of a traced run: every module's input and output during the training forwards that
feed one optimizer step, and the gradient that arrives at the model's output in their backward.

Only the second, targeted run of a failed check installs one (locate.py: world 1 and the failing
world N again, up to the step that diverged, `ScriptRankJob.trace_step`), so a passing check pays nothing.

    tracer = Tracer(step=3); tracer.install(); ...the script...; tracer.uninstall()
    tracer.trace      # Trace: the TracedForwards of step 3 of the first optimizer that stepped

Like the recorder (recorder.py) it uses torch's global hooks only, so the script is unchanged:

* a *root* is a module with parameters called outside any other module's forward, with gradients
  on, in training mode, not in backward (activation checkpointing's recomputation), whose call
  holds data tensors (inputs.data_record: the examples, matched across world sizes by digest);
* while optimizer 0 (the first that stepped) has made `step - 1` steps, each root forward is traced:
  for every module of the root, in the order they happen, its input (the first floating tensor of
  its arguments) when it is called and its output (the first floating tensor of what it returns)
  when it returns, named as the model names it (wrapper prefixes stripped; a wrapper and the module
  it wraps are one module; a module called twice in a forward is `name#2`), and a tensor hook on
  the root's output records the gradient of the loss that reaches it;
* at that optimizer's step `step`, the forwards of roots whose parameters it does not hold are
  dropped (as the recorder drops them from a step's data) and the trace is complete.

Copies are kept on the CPU, up to TRACE_NUMEL elements a rank (then `truncated`: the modules after
that point are not compared).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mgpu.check.script.inrank.records import ForwardRecord
from mgpu.check.script.inrank.inputs import call_kwargs, data_record
from mgpu.check.script.inrank.names import strip_wrappers, wrapper_paths

__all__ = ["Event", "TracedForward", "Trace", "Tracer", "TRACE_NUMEL", "first_float"]

# Elements a rank keeps of the traced tensors, all together (float32: 4 bytes each).
TRACE_NUMEL = 1 << 25


@dataclass
class Event:
    """A module's input ("input", when it is called) or output ("output", when it returns)."""

    label: str                  # the module's name in the model ("" the root), "#2" for a second call
    kind: str                   # "input" or "output"
    tensor: torch.Tensor


@dataclass
class TracedForward:
    """One traced training forward of a root model."""

    root: str                                   # the root's class name
    data: ForwardRecord                         # its data tensors, to match examples across world sizes
    events: list[Event] = field(default_factory=list)
    types: dict = field(default_factory=dict)   # label -> the module's class name (the innermost of wrappers)
    parents: dict = field(default_factory=dict)  # label -> the label of the module whose forward called it
    output_grad: torch.Tensor | None = None     # the gradient that reached the root's output in backward
    root_id: int = 0                            # id() of the root in its rank


@dataclass
class Trace:
    step: int                                   # the optimizer step (of optimizer 0) these forwards fed
    forwards: list[TracedForward] = field(default_factory=list)
    complete: bool = False                      # the step was reached (else the script ended before it)
    truncated: bool = False                     # TRACE_NUMEL reached: later events were not kept


def first_float(value, need_dims: bool = True):
    """The first floating-point tensor in a value (a tensor, a tuple or list, a dict or a ModelOutput),
    with at least one dimension when need_dims (a 0-d loss is no per-example output)."""
    if isinstance(value, torch.Tensor):
        ok = value.is_floating_point() and (value.dim() > 0 or not need_dims) and type(value).__name__ != "DTensor"
        return value if ok else None
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        try:
            items = [value[k] for k in value.keys()]
        except Exception:
            return None
    else:
        return None
    for v in items:
        found = first_float(v, need_dims)
        if found is not None:
            return found
    return None


class Tracer:
    def __init__(self, step: int):
        self.trace = Trace(step)
        self.depth = 0
        self.stack: list = []          # per module call in progress: its label, or None when not traced
        self.current: TracedForward | None = None
        self.names: dict[int, str] = {}   # id(module) -> name in the current root
        self.counts: dict[str, int] = {}  # name -> calls in the current forward
        self.root: nn.Module | None = None
        self.roots: dict[int, set] = {}   # id(root) -> ids of its parameters
        self.optimizer = None             # the first optimizer that stepped
        self.done_steps = 0
        self.kept = 0
        self.handles: list = []

    def install(self) -> None:
        from torch.nn.modules import module as m
        from torch.optim import optimizer as o

        self.handles = [m.register_module_forward_pre_hook(self._pre_forward),
                        m.register_module_forward_hook(self._post_forward, always_call=True),
                        o.register_optimizer_step_pre_hook(self._pre_step),
                        o.register_optimizer_step_post_hook(self._post_step)]

    def uninstall(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    # -- what is traced -------------------------------------------------------------------------------

    def _window(self) -> bool:
        return not self.trace.complete and self.done_steps == self.trace.step - 1

    def _keep(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or self.trace.truncated:
            return None
        if self.kept + t.numel() > TRACE_NUMEL:
            self.trace.truncated = True
            return None
        self.kept += t.numel()
        return t.detach().to("cpu", copy=True)

    def _pre_forward(self, module: nn.Module, args: tuple) -> None:
        self.depth += 1
        if self.depth == 1:
            self.stack = []
            self._start_root(module, args)
        label = None
        if self.current is not None and id(module) in self.names and torch._C._current_graph_task_id() == -1:
            label = self._label(module)
            if label is not None:
                tensor = first_float(args) if args else None
                tensor = tensor if tensor is not None else first_float(call_kwargs(module) or None)
                kept = self._keep(tensor)
                if kept is not None:
                    self.current.events.append(Event(label, "input", kept))
        self.stack.append(label)

    def _label(self, module: nn.Module) -> str | None:
        """The module's label in this forward; None for a module that wraps or is wrapped by the one
        whose forward called it (DDP around the model: one module, named after the innermost class)."""
        name = self.names[id(module)]
        enclosing = next((x for x in reversed(self.stack) if x is not None), None)
        if enclosing is not None and enclosing.split("#")[0] == name:
            self.current.types[enclosing] = type(module).__name__
            return None
        self.counts[name] = self.counts.get(name, 0) + 1
        label = name if self.counts[name] == 1 else f"{name}#{self.counts[name]}"
        self.current.types[label] = type(module).__name__
        if enclosing is not None:
            self.current.parents[label] = enclosing
        return label

    def _start_root(self, module: nn.Module, args: tuple) -> None:
        self.current = None
        if not self._window() or not torch.is_grad_enabled() or not module.training \
                or torch._C._current_graph_task_id() != -1:
            return
        params = {id(p) for p in module.parameters()}
        if not params:
            return
        record = data_record(args, call_kwargs(module))
        if record is None:
            return
        self.roots[id(module)] = params
        self.root = module
        wrapped = wrapper_paths(module)
        self.names = {id(m): strip_wrappers(n, wrapped) for n, m in module.named_modules()}
        self.counts = {}
        self.current = TracedForward(type(module).__name__, record, root_id=id(module))
        self.trace.forwards.append(self.current)

    def _post_forward(self, module: nn.Module, args: tuple, output) -> None:
        label = self.stack.pop() if self.stack else None
        self.depth = max(0, self.depth - 1)
        forward = self.current
        if forward is None:
            return
        if label is not None:
            kept = self._keep(first_float(output))
            if kept is not None:
                forward.events.append(Event(label, "output", kept))
        if self.depth == 0:
            self._hook_output_grad(forward, output)
            self.current = None

    def _hook_output_grad(self, forward: TracedForward, output) -> None:
        t = first_float(output)
        if t is None or not t.requires_grad:
            return

        def keep(grad):
            if forward.output_grad is None:
                forward.output_grad = self._keep(grad)
        t.register_hook(keep)

    # -- the step ---------------------------------------------------------------------------------------

    def _pre_step(self, optimizer, args, kwargs) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
        if optimizer is not self.optimizer or not self._window():
            return
        mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.trace.forwards = [f for f in self.trace.forwards if self.roots.get(f.root_id, set()) & mine]
        self.trace.complete = True

    def _post_step(self, optimizer, args, kwargs) -> None:
        if optimizer is self.optimizer:
            self.done_steps += 1
