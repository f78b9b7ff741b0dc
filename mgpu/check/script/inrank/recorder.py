"""Inside each rank: run the user's script as `python SCRIPT` would, and record its first K optimizer steps.

`rank.run_rank(job)` is what mgpu.launch.spawn runs in every rank (torch's elastic agent has set RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Before the script's first line it

* makes the process look fresh: torch's default generator back at its initial seed (the fork
  server that forked this rank may have drawn from it), numpy's global generator reseeded from
  the OS (as a new interpreter's is; Python's `random` reseeds itself after a fork),
  multiprocessing's start method back to the platform's default (not the fork server's);
  `sys.argv = [SCRIPT, *ARGS]`, the script's folder first on `sys.path` (for `-m MODULE`: the
  current folder), stdout and stderr to files (the launcher shows their last lines on a crash);
* enters `ScriptMode` for the whole run: mgpu's `DropoutOff` (dropout and stochastic depth off at
  the function level), which also counts random numbers drawn inside a root model's forward;
* installs torch's global hooks: `register_module_forward_pre_hook` / `..._forward_hook` find the
  root models (a module with parameters called outside any other module's forward) and record the
  data each training forward consumed; `register_optimizer_step_pre_hook` / `..._post_hook`
  record, for any torch.optim optimizer (and wrappers that call one: accelerate's), each
  parameter's gradient as the optimizer sees it, and its value after the step (before step 1 too).

After the post-hook of step K of the first optimizer that stepped, `StopScript` (a BaseException,
so that the script's `except Exception` does not swallow it) unwinds the script; the rank saves its
record (torch.save, to the launcher's temporary folder), leaves a process group the script left
behind (barrier, destroy) and returns. A script that ends before K steps saves what it made.

Run B of world 1 (job.perturb > 0) adds a rounding-sized perturbation to every parameter when its
model is first called (after its digest is taken, `init_digests`), to every leaf module's output
gradient in the backward of a training forward, and to every gradient before the optimizer uses it
(after recording it): the spread between the two world-1 runs is how far this computation carries
differences of the size that another summation order makes (spread.py, compare.py).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import torch
from torch import nn

from mgpu.check.dropout import random_layer_modules
from mgpu.check.script.inrank.records import ForwardRecord, RankRecord, StepRecord
from mgpu.check.script.inrank.batchnorm import SyncedBatchNorm
from mgpu.check.script.inrank.collectives import CollectiveWatch
from mgpu.check.script.inrank.draws import DrawWatch, module_generator
from mgpu.check.script.inrank.evidence import is_setup_step, process_group_size, suspect_values
from mgpu.check.script.inrank.epochs import made_at
from mgpu.check.script.inrank.evaluation import EvalWatch
from mgpu.check.script.inrank.feeds import FeedWatch
from mgpu.check.script.inrank.keyed import KeyedData, in_fetch, note
from mgpu.check.script.inrank.meeting import Meeting
from mgpu.check.script.inrank.mode import ScriptMode, _Uncounted
from mgpu.check.script.inrank.names import WRAPPER_SEGMENTS, parameter_names, strip_wrappers
from mgpu.check.script.inrank.precision import PrecisionSeen
from mgpu.check.script.plan import ScriptRankJob
from mgpu.check.script.inrank.inputs import Digest, call_kwargs, data_record, tensor_digest
from mgpu.check.script.inrank.settings import settings_of
from mgpu.check.script.inrank.spread import noise_output_gradients, rounding_noise

__all__ = ["Recorder", "StopScript", "ScriptMode", "strip_wrappers", "Digest", "tensor_digest", "WRAPPER_SEGMENTS"]

# Ranks other than 0 keep their tensors whole up to this many elements a snapshot; above, digests.
KEEP_RANK_NUMEL = 1 << 23
# --whole-run: a rank keeps the gradients and weights of its steps up to this many elements in all; the
# steps after keep their data, settings and epoch, not their tensors ("light": the report says so). The
# same count at every world size (the parameters' numel), so world 1 and world N keep the same steps.
# MGPU_WHOLE_RUN_KEEP_NUMEL sets another bound (read in each rank, whose environment is the launcher's).
WHOLE_RUN_KEEP_NUMEL = 1 << 27


class StopScript(BaseException):
    """Raised in the optimizer's post-hook after step K: the script has done what the check needs."""


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient whole, on the CPU: FSDP2's DTensors gathered (`full_tensor`)."""
    t = t.detach()
    if hasattr(t, "full_tensor") and type(t).__name__ == "DTensor":
        t = t.full_tensor()
    return t.to("cpu", copy=True)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if type(t).__name__ == "DTensor" else t


class _Depth(threading.local):
    value = 0
    stack: list = None
    root_forward = False   # the outermost call is a recorded training forward (its output's dtype is noted)


class Recorder:
    def __init__(self, job: ScriptRankJob):
        self.steps = job.steps
        self.perturb = job.perturb
        self.perturb_seed = job.perturb_seed
        self.sync_batchnorm = job.sync_batchnorm
        self.rank = int(os.environ.get("RANK", "0"))
        self.keep_numel = math.inf if self.rank == 0 else KEEP_RANK_NUMEL
        self.depth = _Depth()
        self.roots: dict[int, nn.Module] = {}            # id -> root module with parameters, in order seen
        self.root_params: dict[int, set[int]] = {}
        self.pending: list[ForwardRecord] = []           # forwards since the last step
        self.optimizers: dict[int, int] = {}             # id(optimizer) -> index, in order of first step
        self.names: dict[int, dict[int, str]] = {}       # optimizer index -> id(param) -> name
        self.counts: dict[int, int] = {}                 # optimizer index -> steps made
        self.records: list[StepRecord] = []              # one per optimizer step, in order
        self.random_draws: dict[str, int] = {}
        self.random_where: dict[str, str] = {}
        self.forwards = 0
        self.first_forward: float | None = None
        self.step_times: list[float] = []
        self.stopped = False
        self.batchnorm: list[str] = []
        self.random_modules: list[str] = []
        self.init_digests: dict[str, str] = {}   # each root's parameters when first called, before run B's perturbation
        self.precision = PrecisionSeen()        # what the training forwards ran at (autocast, dtypes)
        self.mode = ScriptMode(self)
        self.handles: list = []
        self.backwards = 0                       # Tensor.backward calls so far
        self.uninitialised: dict = {}            # name -> suspect_values, when first called
        self.skipped: dict[int, int] = {}        # optimizer index -> set-up steps not counted (evidence.is_setup_step)
        self.collectives = CollectiveWatch(lambda: bool(self.pending))
        self.feeds = FeedWatch()                 # the DataLoaders' samplers and the LR schedulers (feeds.py)
        self.quiet = False                       # the recorder's own draws (_Uncounted)
        self.draws = DrawWatch(note)             # seeds, draws outside the forward, generator states (draws.py)
        self.batches: list = []                  # dataset indices of each batch delivered since the last step
        self.keyed = KeyedData(os.path.join(job.folder, f"{job.tag}-rank{self.rank}.draws"), self.batches.append,
                               self.draws.outer_states)   # augmentation keyed to the example (keyed.py)
        # --whole-run: every DataLoader pass and the epochs' cut (epochs.py); at N ranks, the collectives
        # published and the watcher that names a rank that left the others waiting (meeting.py)
        self.whole = job.epoch_steps > 0
        self.trace_step = job.trace_step         # locate.py's traced rerun stops at its step, whole run or not
        self.evaluation = EvalWatch(self.rank) if self.whole else None   # collectives, lines, saves (evaluation.py)
        self.epochs = self.evaluation.epoch_watch(job.epoch_steps, self.batches) if self.whole else None
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.meeting = Meeting(job.folder, job.tag, self.rank, world, self._progress) \
            if self.whole and world > 1 else None
        self.ddp_forward = False                 # a DDP training forward that syncs since the last backward
        self.step_at = ""                        # the script's line of the last optimizer step
        self.kept_numel = 0                      # --whole-run: gradient and weight elements kept so far
        self.float64 = job.float64               # confirm.py's runs: the script computed in float64 (float64.py)
        self.leaf_outputs = 0                    # run B: leaf module outputs given noise in the backward (spread.py)
        self.keep_bound = int(os.environ.get("MGPU_WHOLE_RUN_KEEP_NUMEL", "") or WHOLE_RUN_KEEP_NUMEL)

    # -- hooks --------------------------------------------------------------------------------------

    def install(self) -> None:
        from torch.nn.modules import module as m
        from torch.optim import optimizer as o

        self.handles = [
            m.register_module_forward_pre_hook(self._pre_forward),
            m.register_module_forward_hook(self._post_forward, always_call=True),
            o.register_optimizer_step_pre_hook(self._pre_step),
            o.register_optimizer_step_post_hook(self._post_step),
        ]
        self.mode.__enter__()
        self.collectives.install()
        self.feeds.install()
        self.draws.install()
        self.keyed.install()
        if self.epochs is not None:
            self.epochs.install()   # outermost: a cut batch is never fetched
            self.evaluation.install()
        if self.meeting is not None:
            self.meeting.install()

    def uninstall(self) -> None:
        if self.meeting is not None:
            self.meeting.uninstall()
        if self.epochs is not None:
            self.evaluation.uninstall()
            self.epochs.uninstall()
        self.keyed.uninstall()  # the reverse of install: keyed wraps what FeedWatch wrapped
        self.draws.uninstall()
        self.feeds.uninstall()
        self.collectives.uninstall()
        for h in self.handles:
            h.remove()
        self.handles = []
        try:
            self.mode.__exit__(None, None, None)
        except Exception:  # the script left another mode on the stack above it
            pass

    @staticmethod
    def in_backward() -> bool:
        return torch._C._current_graph_task_id() != -1

    def classify_draw(self, name: str, args, kwargs) -> None:
        """A torch random function called: in a DataLoader fetch, a model's forward (the randomness
        finding), a module without parameters called outside the model (augmentation in the step), or the
        training step (draws.py)."""
        where, stack = in_fetch(), self.depth.stack
        if where:
            if where != "loader":
                self.draws.draw(name, args, kwargs, where, stack[-1] if stack and self.depth.value else None)
        elif self.depth.value and stack:
            if any(True for _ in stack[0].parameters()):
                self.random_draw(name)
            else:
                self.draws.draw(name, args, kwargs, "step", stack[-1])
        elif self.first_forward is not None or self.keyed.passes:
            self.draws.draw(name, args, kwargs, "step")

    def random_draw(self, name: str) -> None:
        self.random_draws[name] = self.random_draws.get(name, 0) + 1
        if name not in self.random_where and self.depth.stack:
            inner = self.depth.stack[-1]
            root = self.depth.stack[0]
            where = next((n for n, mod in root.named_modules() if mod is inner), "")
            self.random_where[name] = f"{strip_wrappers(where) or 'the model'} ({type(inner).__name__})"

    def _pre_forward(self, module: nn.Module, args: tuple) -> None:
        d = self.depth
        if d.stack is None:
            d.stack = []
        d.stack.append(module)
        d.value += 1
        if d.value > 1 and d.root_forward and not self.precision.autocast:
            self.precision.inside()  # autocast entered inside the root's forward (accelerate wraps forward so)
        if d.value != 1 or self.stopped or self.in_backward() or not torch.is_grad_enabled():
            return
        key = id(module)
        if key not in self.root_params:
            params = {id(p) for p in module.parameters()}
            if not params:
                self.root_params[key] = params
                return
            self.root_params[key], self.roots[key] = params, module
            self._survey(module)
        elif not self.root_params[key]:
            return
        kwargs = call_kwargs(module)
        record = data_record(args, kwargs)
        if self.first_forward is None:
            self.first_forward = time.time()
        if record is not None:
            record.root, record.root_name, record.training = key, type(module).__name__, module.training
            record.backwards = self.backwards
            if module.training:
                if type(module).__name__ == "DistributedDataParallel" and getattr(module, "require_backward_grad_sync",
                                                                                   True):
                    self.ddp_forward = True
                self.draws.state("forward", module_generator(module))
                self.precision.forward(module)
                self.depth.root_forward = True
            self.pending.append(record)
            self.forwards += 1

    def _post_forward(self, module, args, output) -> None:
        d = self.depth
        if self.perturb and d.root_forward and not self.stopped and next(module.children(), None) is None:
            # run B: each term the backward's sums over the examples add carries a rounding (spread.py)
            self.leaf_outputs += 1
            noise_output_gradients(output, self.perturb, 7_919 * self.perturb_seed + self.leaf_outputs, self.float64)
        if d.value:
            d.value -= 1
            if d.value == 0 and d.root_forward:
                d.root_forward = False
                self.precision.output(output)
            if d.stack:
                d.stack.pop()

    def _survey(self, root: nn.Module) -> None:
        """What a root model holds that the check must know about: un-synchronised BatchNorm in
        training mode (computed as SyncBatchNorm would, at every world size: job.sync_batchnorm), and the
        dropout and stochastic-depth modules switched off."""
        for name, mod in root.named_modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and not isinstance(mod, nn.SyncBatchNorm) \
                    and mod.training:
                label = f"{strip_wrappers(name) or type(mod).__name__} ({type(mod).__name__})"
                if label not in self.batchnorm:
                    self.batchnorm.append(label)
                if self.sync_batchnorm and "forward" not in vars(mod):
                    mod.forward = SyncedBatchNorm(mod)
        for name, p in root.named_parameters():
            name = strip_wrappers(name)
            if name not in self.init_digests:
                full = _full(p)
                self.init_digests[name] = tensor_digest(full)
                if (suspect := suspect_values(full)) is not None:  # uninitialised memory (evidence.py)
                    self.uninitialised[name] = suspect
                if self.perturb:
                    with torch.no_grad():
                        local = _local(p.data)
                        local.add_(self._noise(local.detach(), 0, len(self.init_digests)).to(local.dtype))
        for label in random_layer_modules(root):
            stripped = label.split(" ", 1)
            label = " ".join([strip_wrappers(stripped[0]), *stripped[1:]])
            if label not in self.random_modules:
                self.random_modules.append(label)

    def _optimizer_index(self, optimizer) -> int:
        key = id(optimizer)
        if key not in self.optimizers:
            self.optimizers[key] = len(self.optimizers)
        return self.optimizers[key]

    def _params(self, optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def _names(self, index: int, params: list[torch.Tensor]) -> dict[int, str]:
        if index not in self.names or not all(id(p) in self.names[index] for p in params):
            self.names[index] = parameter_names(self.roots.values(), index, params)
        return self.names[index]

    def _keep(self, t: torch.Tensor):
        return t if t.numel() <= self.keep_numel else Digest(t)

    def _pre_step(self, optimizer, args, kwargs) -> None:
        if self.stopped:
            return
        index = self._optimizer_index(optimizer)
        k = self.counts.get(index, 0) + 1
        params = self._params(optimizer)
        names = self._names(index, params)
        mine = {id(p) for p in params}
        trained = set().union(*(self.root_params.get(r, set()) for r in self.roots))
        forwards = [f for f in self.pending if self.root_params[f.root] & mine]
        used = {id(f) for f in forwards}
        if any(f.training for f in forwards):  # an evaluation under grad between steps is no training data
            forwards = [f for f in forwards if f.training]
        self.pending = [f for f in self.pending if id(f) not in used and self.root_params[f.root] & trained]
        indices, self.batches[:] = list(self.batches), []
        rec = StepRecord(optimizer=index, step=k, optimizer_type=type(optimizer).__name__, forwards=forwards,
                         grads={}, settings=settings_of(optimizer),  # lr as a scheduler set it for this step
                         loaders=self.feeds.loaders(), schedulers=self.feeds.schedulers(optimizer))
        rec.indices = indices  # dataset indices of the batches since the last step (keyed.py)
        if k == 1:
            rec.before = {names[id(p)]: self._keep(_full(p)) for p in params}
        if self.whole:
            numel = 2 * sum(p.numel() for p in params)
            rec.light = self.kept_numel + numel > self.keep_bound and bool(self.records)
            self.kept_numel += 0 if rec.light else numel
        for i, p in enumerate(params):
            name = names[id(p)]
            g = None if p.grad is None else _full(p.grad)
            if g is not None and self.perturb:
                noise = self._noise(g, k, i)
                g = g + noise
                with torch.no_grad():
                    _local(p.grad).add_(noise.to(p.grad.device, p.grad.dtype))
            if not rec.light:
                rec.grads[name] = None if g is None else self._keep(g)
        self._current = rec

    def _noise(self, g: torch.Tensor, step: int, i: int) -> torch.Tensor:
        """Run B's rounding-sized difference for parameter i at step `step` (spread.py), drawn uncounted:
        not the script's randomness."""
        with _Uncounted(self):
            return rounding_noise(g, self.perturb, 1_000_003 * step + i + 7_919 * self.perturb_seed, self.float64)

    def _post_step(self, optimizer, args, kwargs) -> None:
        if self.stopped:
            return
        index = self._optimizer_index(optimizer)
        rec = self._current
        made = self.counts.get(index, 0) + self.skipped.get(index, 0)
        if is_setup_step(rec.grads, rec.forwards, self.forwards, made):
            self.skipped[index] = self.skipped.get(index, 0) + 1   # building the optimizer's state: not step 1
            return
        rec.backwards, rec.process_group = self.backwards, process_group_size()
        params = self._params(optimizer)
        names = self.names[index]
        rec.after = {} if rec.light else {names[id(p)]: self._keep(_full(p)) for p in params}
        self.counts[index] = rec.step
        if self.epochs is not None:
            rec.epoch = self.epochs.stepped() if index == 0 else self.epochs.current()
            self.step_at = made_at(sys._getframe(1))
        self.records.append(rec)
        self.step_times.append(time.time())
        if index == 0 and rec.step >= self.steps and (not self.whole or self.trace_step):  # a whole run: its end
            self.stopped = True
            raise StopScript()

    def _progress(self) -> tuple:
        """(epoch, optimizer steps, the script's line of the last step): what the meeting publishes."""
        return (self.epochs.current() if self.epochs is not None else None), len(self.records), self.step_at

    def result(self) -> RankRecord:
        record = self._record()
        record.passes = list(self.epochs.passes) if self.epochs is not None else []
        if self.evaluation is not None:
            self.evaluation.into(record, self.epochs.switches)
        record.randomness = {**self.draws.evidence(), **self.keyed.evidence(), "dropout": dict(self.mode.calls)}
        return record

    def _record(self) -> RankRecord:
        return RankRecord(steps=self.records, forwards=self.forwards, batchnorm=self.batchnorm,
                          init_digests=self.init_digests, random_modules=self.random_modules,
                          dropout_calls=dict(self.mode.calls), random_draws=dict(self.random_draws),
                          random_where=dict(self.random_where), optimizers=len(self.optimizers), stopped=self.stopped,
                          precision=self.precision.to_json(), uninitialised=self.uninitialised,
                          grad_collectives=self.collectives.calls(), setup_steps=sum(self.skipped.values()))
