"""`run_check(spec)`: a model under every strategy and device count, against single-device training.

    python -m mgpu check examples/tiny_lm.py:spec --devices 2,3 --json check.json
    >>> report = run_check(load_spec("examples/tiny_lm.py:spec"))
    >>> check_data_parallel(spec)          # in a pytest test: AssertionError with the first divergence

What it does, in order (docs/check.md says what each check means):

1. validates the spec (bad input: SpecError) and probes the model (mgpu/parity/probe.py): random
   layers, layers that mix the examples of a batch, buffers its forward writes or reassigns,
   parameters some shards leave without a gradient, a loss that is a mean;
2. runs the single-device reference in float64 and float32 for each device count
   (mgpu/parity/record.py), and each strategy for each device count: a few steps on the same
   global batches (`plan`), again on a batch the device count does not divide (`uneven`), and
   with gradient accumulation (`accumulate`); DDP ranks in one spawn per world size, each rank
   building the model from a different seed;
3. compares (mgpu/parity/compare.py) and reports a `CheckResult` per check and strategy: pass,
   fail with the first divergence and a command that reproduces it, finding, or skipped (why).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import pickle
import shlex
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from mgpu.config import CHECK_STRATEGIES, CheckOptions
from mgpu.devices import devices, exact_gpu_math, set_exact_gpu_math, torch_threads
from mgpu.errors import CheckTimeout, LaunchError, MgpuError, ParityError, SpecError, one_line
from mgpu.parity.compare import Divergence, compare_bitwise, compare_to_reference, error
from mgpu.parity.dropout import DropoutOff
from mgpu.parity.records import NO_BUFFERS, CheckResult, Report
from mgpu.parity.probe import (find_buffer_updates, find_mixing_layers, find_random_layers, loss_is_a_sum,
                               switch_off_dropout)
from mgpu.parity.report import failure_message
from mgpu.parity.record import (LocalShard, Plan, Recording, assemble_shards, check_ties, has_shards, load_snapshot,
                                record_strategy, reference_run, reference_step, snapshot, step_timeout)
from mgpu.spec import ModelSpec, builtin_spec, load_spec, validate_spec
from mgpu.strategies import RANK_STRATEGIES  # each run of these is a spawn of its ranks

__all__ = ["CheckOptions", "CheckResult", "Report", "run_check", "check_data_parallel", "CHECK_STRATEGIES"]

def make_plans(options: CheckOptions) -> dict[str, Plan]:
    """The runs of each strategy: plain steps, a batch the device counts do not divide, and accumulation
    over micro-steps of different sizes (CheckOptions.accumulation_batch)."""
    return {"plain": Plan(options.batch_size, options.steps, options.seed),
            "uneven": Plan(options.uneven_batch(), options.steps, options.seed),
            "accumulate": Plan(options.accumulation_batch(), options.steps, options.seed, micro_steps=options.accumulate)}


def make_optimizer(options: CheckOptions, spec: ModelSpec):
    """The spec's optimizer, or the check's SGD with momentum and weight decay (so that optimizer
    state and decay are exercised)."""
    return spec.optimizer or SGDFactory(options.lr, options.momentum, options.weight_decay)


@dataclass(frozen=True)
class SGDFactory:
    lr: float
    momentum: float
    weight_decay: float

    def __call__(self, params):
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


# -- the model's traits -----------------------------------------------------------------------------

@dataclass
class Traits:
    dropout: list[str]             # nn.Dropout-family modules
    dropout_calls: dict            # dropout the forward applies through torch's functions: {call: count per forward}
    other_randomness: bool
    mixing: bool
    mixing_layers: list[str]
    changed_buffers: list[str]
    reassigned_buffers: list[str]
    mean_loss: str | None
    ties: list[list[str]]
    unused: list[str] = field(default_factory=list)


def _probe(spec: ModelSpec, model: torch.nn.Module, plan: Plan, n: int) -> Traits:
    inputs, target = plan.batch(spec, 1)
    dropout, calls, other = find_random_layers(spec, model, inputs)
    switch_off_dropout(model, calls=bool(calls))  # the model every run copies: held off in all of them
    with DropoutOff():  # the probes below also run the model's modules on their own, outside its forward
        mixing, layers = (False, []) if other else find_mixing_layers(model, inputs, n=n)
        changed, reassigned = find_buffer_updates(model, inputs)
        mean_loss = loss_is_a_sum(spec, model, inputs, target)
    return Traits(dropout, calls, other, mixing, layers, changed, reassigned, mean_loss, check_ties(model))


# -- running ------------------------------------------------------------------------------------------

def _strategy_for(name: str, n: int, timeout: float, device: str = "auto", amp: str = "off", compile: bool = False):
    from mgpu.config import TrainConfig
    from mgpu.strategies import get_strategy

    strategy = get_strategy(name).create(TrainConfig(strategy=name, devices=n, out=None, progress=False,
                                                     timeout=timeout, device=device))
    # --amp bf16: the forward and loss under bfloat16 autocast; --compile: the (wrapped) model under torch.compile
    strategy.use_speed_options(amp=amp, compile=compile)
    return strategy


def _run_in_process(spec, model, name: str, n: int, plan: Plan, options: CheckOptions) -> Recording:
    strategy = _strategy_for(name, n, options.step_timeout or 60.0, options.device, options.amp, options.compile)
    strategy.use_objective(spec.objective)
    strategy.setup(copy.deepcopy(model), make_optimizer(options, spec))
    try:
        return record_strategy(strategy, spec, plan, label=_label(name, n), timeout_s=options.step_timeout)
    finally:
        strategy.teardown()


def run_device(n: int, kind: str = "auto") -> torch.device:
    """The first device of a run on n devices: cuda:0 when n GPUs exist (and kind allows), else the CPU (emulated)."""
    return devices(n, kind=kind)[0]


def _label(name: str, n: int) -> str:
    return f"{name} on {n} {'ranks' if name in RANK_STRATEGIES else 'devices' if n > 1 else 'device'}"


@dataclass
class RankJob:
    """What each rank of the ddp and fsdp checks on one world size runs (picklable: the ranks are
    fresh processes). The strategies run one after the other in one spawn, on one process group:
    starting processes and loading the model's libraries is a large share of a rank run."""

    strategies: tuple          # ddp, fsdp
    source: str | None
    spec_options: dict
    spec_blob: bytes | None
    initial: dict              # rank 0's weights and buffers (other ranks build their own from other seeds)
    plans: list
    options: CheckOptions
    find_unused: bool
    dropout_calls: bool = False    # the forward calls torch's dropout functions itself: hold them off too

    def spec(self) -> ModelSpec:
        if self.spec_blob is not None:
            return pickle.loads(self.spec_blob)
        return load_spec(self.source, **self.spec_options)


def rank_main(job: RankJob):
    """In each rank: the plans under each strategy of the job; rank 0 returns every rank's
    recordings, {strategy: [plan][rank]} (pickled)."""
    set_exact_gpu_math()  # as run_check has it in the launching process
    spec = job.spec()
    world = int(os.environ["WORLD_SIZE"])
    out, strategy = {}, None
    try:
        for name in job.strategies:
            # The strategies share the process group: the second one's create() finds it set up.
            strategy = _strategy_for(name, world, job.options.step_timeout or 60.0, job.options.device,
                                     job.options.amp, job.options.compile)
            out[name] = _rank_plans(job, spec, strategy)
        # Bytes, not tensors: torch's multiprocessing would pass each tensor as a file descriptor to
        # the launcher, and a model of a few hundred tensors runs out of them.
        return pickle.dumps(out) if strategy.rank == 0 else None
    finally:
        if strategy is not None:
            strategy.teardown()


def _rank_plans(job: RankJob, spec: ModelSpec, strategy) -> list | None:
    """Every plan under one strategy; on rank 0, [plan][rank] recordings."""
    import torch.distributed as dist

    strategy.find_unused_parameters = job.find_unused
    rank, world = strategy.rank, strategy.world_size
    out = []
    for plan in job.plans:
        model = spec.build_seeded(job.options.seed + 7919 * rank)  # ranks start apart: the strategy must make them equal
        switch_off_dropout(model, calls=job.dropout_calls)
        if rank == 0:
            load_snapshot(model, job.initial)
        strategy.use_objective(spec.objective)
        strategy.setup(model, make_optimizer(job.options, spec))
        rec = record_strategy(strategy, spec, plan, label=f"{_label(strategy.name, world)} (rank {rank})",
                              timeout_s=job.options.step_timeout, keep_shards=True)
        _send_only_differences(rec, rank, world)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(rec, gathered, dst=0)  # to rank 0 only: every rank's copy of all would cost memory
        if rank == 0:
            _fill_from_rank_0(gathered)
        out.append(gathered)
    return out


def _send_only_differences(rec: Recording, rank: int, world: int) -> None:
    """Before rank 0 gathers the recordings: an entry of a state of rank r > 0 that is bitwise rank 0's
    (what a correct strategy gives at every step) is left out (None) when the digests of the two
    states say so; so is the optimizer state, of which only rank 0's is compared (under fsdp the
    other ranks send their shards of it). A model's state is then sent and pickled once, not once
    per rank: for a 5 M-parameter model that was most of a rank run's time. Shards (LocalShard) are
    always sent: rank 0 puts them together."""
    import torch.distributed as dist

    digests = [state_digest(_unsharded(state[0])) for state in rec.states]
    everyone = [None] * world
    dist.all_gather_object(everyone, digests)
    if rank > 0:
        rec.states = [[{k: v if isinstance(v, LocalShard) else None for k, v in state[0].items()}] if mine == first
                      else state for mine, first, state in zip(digests, everyone[0], rec.states)]
        if not any(has_shards(o) for o in rec.optimizer_states):
            rec.optimizer_states = []


def _unsharded(state: dict) -> dict:
    return {k: v for k, v in state.items() if not isinstance(v, LocalShard)}


def _fill_from_rank_0(per_rank: list) -> None:
    """On rank 0, after the gather: rank 0's entries where the other ranks left them out as equal,
    and every sharded tensor whole (assemble_shards), in states, gradients and rank 0's optimizer states."""
    first = per_rank[0]
    for rec in per_rank[1:]:
        rec.states = [[{k: first.states[s][0][k] if v is None else v for k, v in state[0].items()}]
                      for s, state in enumerate(rec.states)]
    for s in range(len(first.states)):
        for rec, whole in zip(per_rank, assemble_shards([rec.states[s][0] for rec in per_rank])):
            rec.states[s] = [whole]
    for rec, whole in zip(per_rank, assemble_shards([rec.grads[0] for rec in per_rank])):
        rec.grads = [whole]
    if any(has_shards(o) for o in first.optimizer_states):
        first.optimizer_states = [assemble_shards([rec.optimizer_states[s] for rec in per_rank])[0]
                                  for s in range(len(first.optimizer_states))]


def recording_digest(rec: Recording) -> str:
    """A digest of everything a comparison reads from a recording: every replica's states, gradients
    and ties, the optimizer states and statistics."""
    h = hashlib.blake2b(digest_size=16)
    for states in rec.states:
        for state in states:
            h.update(state_digest(state).encode())
    for grads in rec.grads:
        h.update(state_digest({k: g for k, g in grads.items() if g is not None}).encode())
        h.update(repr(sorted(k for k, g in grads.items() if g is None)).encode())
    for optimizer_state in rec.optimizer_states:
        per_parameter = optimizer_state.get("state", {})
        h.update(state_digest({f"{i}: {k}": v for i, state in per_parameter.items() for k, v in state.items()
                               if isinstance(v, torch.Tensor)}).encode())
        h.update(repr(({i: {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
                        for i, state in per_parameter.items()}, optimizer_state.get("param_groups"))).encode())
    h.update(repr((rec.stats, rec.ties, rec.shards)).encode())
    return h.hexdigest()


def state_digest(state: dict) -> str:
    """A digest of a snapshot's names, dtypes, shapes and bytes: equal digests, bitwise equal states."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(state):
        t = state[name].detach().contiguous()
        h.update(f"{name} {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _spec_blob(spec: ModelSpec) -> tuple[bytes | None, str | None]:
    """(the pickled spec, None) or (None, why it cannot travel) when it has no source to load from."""
    if spec.source:
        return None, None
    try:
        return pickle.dumps(spec), None
    except Exception as e:
        return None, (f"the spec cannot be sent to DDP ranks ({type(e).__name__}: {e}): give it as MODULE:FUNCTION "
                      "or build it from module-level functions")


# -- comparing ----------------------------------------------------------------------------------------

def _listed(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _worst(pairs) -> dict:
    worst = {"max_abs": 0.0, "max_rel": 0.0}
    for abs_err, rel_err in pairs:
        worst["max_abs"] = max(worst["max_abs"], abs_err)
        worst["max_rel"] = max(worst["max_rel"], rel_err)
    return worst


def _only(state: dict, kind: str) -> dict:
    return {k: v for k, v in state.items() if k.startswith(kind)}


@dataclass
class _Refs:
    """Reference recordings, computed once per (plan, device count, dtype)."""

    spec: ModelSpec
    model: torch.nn.Module
    options: CheckOptions
    cache: dict = field(default_factory=dict)
    comparisons: dict = field(default_factory=dict)  # (kind, shards, the recording's digest) -> _compare_run's result

    def compared(self, kind: str, rec: Recording, plan: Plan, shards: int) -> list:
        """_compare_run(kind, rec, ...), computed once for bitwise equal recordings: on the CPU,
        nn.DataParallel on 2 and on 3 devices is the same pass-through run, and its reference steps
        (most of a check's time for a large model) need not be taken twice."""
        key = (kind, plan, shards, recording_digest(rec))
        if key not in self.comparisons:
            self.comparisons[key] = _compare_run(kind, rec, self, plan, shards)
        return self.comparisons[key]

    def fresh_optimizer_state(self) -> dict:
        return make_optimizer(self.options, self.spec)(list(copy.deepcopy(self.model).parameters())).state_dict()

    @functools.cached_property
    def initial(self) -> dict:
        return snapshot(self.model)

    def step(self, state: dict, optimizer_state: dict, plan: Plan, step: int, n: int, dtype, device="cpu",
             amp: str = "off"):
        """The reference step from (state, optimizer_state). A run's first step starts from the model
        as built with a fresh optimizer, whatever the strategy: that step is computed once per
        (plan, shards, dtype, device, amp) and shared (a run that starts elsewhere fails `start`, and
        gets its own)."""
        if step == 1 and not optimizer_state.get("state") and compare_bitwise(state, self.initial, 0, None) is None:
            key = ("first step", plan, n, dtype, str(device), amp)
            if key not in self.cache:
                self.cache[key] = self._step(state, optimizer_state, plan, step, n, dtype, device, amp)
            return self.cache[key]
        return self._step(state, optimizer_state, plan, step, n, dtype, device, amp)

    def _step(self, state, optimizer_state, plan, step, n, dtype, device, amp):
        return reference_step(self.spec, self.model, state, optimizer_state, plan, step, n, dtype,
                              make_optimizer(self.options, self.spec), timeout_s=self.options.step_timeout,
                              label=f"the single-device reference ({dtype}, {n} shards)", device=device,
                              autocast=torch.bfloat16 if amp == "bf16" else None)

    def get(self, plan: Plan, n: int, dtype) -> Recording:
        key = (plan, n, dtype)
        if key not in self.cache:
            self.cache[key] = reference_run(self.spec, self.model, plan, n, dtype, make_optimizer(self.options, self.spec),
                                            timeout_s=self.options.step_timeout,
                                            label=f"the single-device reference ({dtype}, {n} shards)")
        return self.cache[key]


def named_optimizer_state(state_dict: dict, names: list[str]) -> dict:
    """An optimizer's state_dict as {"param name: key": tensor} (parameters in `names` order)."""
    out = {}
    for index, state in state_dict.get("state", {}).items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"{names[index]}: {key}"] = value
    return out


def _compare_run(kind: str, rec: Recording, refs: "_Refs", plan: Plan, n: int) -> list[tuple[str, Divergence | None, dict]]:
    """(check name, first divergence or None, worst errors) for one strategy run.

    Step by step: step s of the run is compared with one reference step (float64; float32 for the
    error's scale) taken from the run's own state entering step s (replica 0's weights, buffers and
    optimizer state). Errors then cannot pile up over steps, and a ReLU that a float32 rounding
    flips in one run and not in another cannot make a correct run look wrong; a bug shows in the
    step where it happens.
    """
    names = [name for name, _ in refs.model.named_parameters()]
    replicas = len(rec.states[0])
    # The float32 step that sizes the error runs where the checked run did (the first GPU when n
    # GPUs exist): a GPU's kernels round differently from a CPU's; sized by the CPU's float32,
    # LeNet's first-step gradients on one H200 were 3.4 times past what is allowed (docs/gpu.md).
    where = run_device(n, refs.options.device)
    steps = []
    for s in range(1, plan.steps + 1):
        state, opt = rec.states[s - 1][0], rec.optimizer_states[s - 1]
        # Under --amp bf16 the step that sizes the error is the single-device bf16 step: what a correct
        # run's own rounding is then. The value stays the float64 step's.
        steps.append((refs.step(state, opt, plan, s, n, torch.float64),
                      refs.step(state, opt, plan, s, n, torch.float32, device=where, amp=refs.options.amp)))
    first64, first32 = steps[0]

    def gradients():
        div, pairs = None, []
        for r in range(replicas):
            div = div or compare_to_reference(rec.grads[r], first64.grads, first32.grads, 1, r, prefix="gradient ")
            pairs += [error(rec.grads[r][k], g) for k, g in first64.grads.items()
                      if g is not None and rec.grads[r].get(k) is not None]
        return div, _worst(pairs)

    def states(kind_prefix: str):
        div, pairs = None, []
        for s, (r64, r32) in enumerate(steps, start=1):
            got = _only(rec.states[s][0], kind_prefix)
            div = div or compare_to_reference(got, _only(r64.state, kind_prefix), _only(r32.state, kind_prefix), s, 0)
            pairs += [error(got[k], v) for k, v in _only(r64.state, kind_prefix).items()
                      if v.is_floating_point() and k in got]
        return div, _worst(pairs)

    def optimizer():
        div, pairs = None, []
        for s, (r64, r32) in enumerate(steps, start=1):
            got = named_optimizer_state(rec.optimizer_states[s], names)
            want = named_optimizer_state(r64.optimizer_state, names)
            div = div or compare_to_reference(got, want, named_optimizer_state(r32.optimizer_state, names), s, 0,
                                              prefix="optimizer state ")
            pairs += [error(got[k], v) for k, v in want.items() if k in got and v.is_floating_point()]
        return div, _worst(pairs)

    def statistics():
        for s, (r64, r32) in enumerate(steps, start=1):
            div = _compare_stats(s, rec.stats[s - 1], r64.stats, r32.stats)
            if div:
                return div, {}
        return None, {}

    if kind == "plain":
        out = [("gradients", *gradients()), ("weights", *states("weight "))]
        out.append(("buffers", *states("buffer ")) if any(k.startswith("buffer ") for k in rec.states[0][0])
                   else ("buffers", "none", {}))
        return out + [("optimizer", *optimizer()), ("statistics", *statistics())]
    div, errs = gradients() if kind == "uneven" else (None, {})
    div2, errs2 = states("")
    return [(kind, div or div2, _worst([(errs.get("max_abs", 0.0), errs.get("max_rel", 0.0)),
                                        (errs2["max_abs"], errs2["max_rel"])]))]


def _compare_stats(step: int, got: list, r64: list, r32: list) -> Divergence | None:
    """The step's reported loss within tolerance, its count of correct examples the reference's."""
    as_t = lambda v: {"loss_sum": torch.tensor(v, dtype=torch.float64)}  # noqa: E731
    loss = compare_to_reference(as_t(got[0]), as_t(r64[0]), as_t(r32[0]), step, None, prefix="reported ")
    if loss:
        return loss
    if abs(got[1] - r64[1]) > 1e-6 and abs(got[1] - r32[1]) > 1e-6:
        return Divergence(step, "reported correct count", None, abs(got[1] - r32[1]),
                          abs(got[1] - r32[1]) / max(abs(r32[1]), 1e-12), 0.0,
                          f"the count of correct examples of the single-device run ({r32[1]:g})")
    return None


def _replicas_agree(rec: Recording) -> Divergence | None:
    """Every replica/rank bitwise equal to replica 0 at every step (start included)."""
    for s, states in enumerate(rec.states):
        for r in range(1, len(states)):
            div = compare_bitwise(states[r], states[0], s, r)
            if div:
                return div
    return None


# -- the whole check ----------------------------------------------------------------------------------

def run_check(spec: ModelSpec, options: CheckOptions | None = None,
              progress: Callable[[str], None] | None = None) -> Report:
    """Check `spec` under options.strategies x options.devices; see the module docstring.

    Bad input (the spec, the options) raises an MgpuError before anything runs; a model that hangs
    raises CheckTimeout naming the strategy and step. Parity failures are in the report.
    """
    # One thread: emulated devices run one after the other, and spinning threads only slow a busy
    # machine. Exact GPU math: TF32 would move a GPU's float32 far past the tolerances, and cuDNN's
    # default algorithms differ from run to run (docs/gpu.md).
    with torch_threads(1), exact_gpu_math():
        return _run_check(spec, options, progress)


def _run_check(spec: ModelSpec, options: CheckOptions | None, progress) -> Report:
    start_time = time.perf_counter()
    options = (options or CheckOptions()).validate()
    if not isinstance(spec, ModelSpec):
        raise SpecError(f"run_check needs an mgpu.ModelSpec, got {type(spec).__name__} (load_spec('MODULE:FUNCTION') makes one)")
    say = progress or (lambda line: None)
    if "fsdp" in options.strategies:
        from mgpu.strategies.fsdp import check_fsdp_supported

        check_fsdp_supported()
    plans = make_plans(options)
    with step_timeout(options.step_timeout and 4 * options.step_timeout, f"{spec.name}: the first forwards (probing the model)"):
        validate_spec(spec, batch_size=min(options.batch_size, 4), seed=options.seed)
        model = spec.build_seeded(options.seed)
        traits = _probe(spec, model, plans["plain"], n=max(options.devices))
    refs = _Refs(spec, model, options)
    results: list[CheckResult] = []
    repro = _reproducer(spec, options)

    def add(result: CheckResult) -> None:
        results.append(result)
        where = "" if result.strategy is None else f" {_label(result.strategy, result.devices)}:"
        detail = f" ({result.first_divergence.describe()})" if result.first_divergence else ""
        say(f"check:{where} {result.name}: {result.status}{detail}")

    # Unused parameters: some device's shard leaves them without a gradient on some step's batch
    # (float32 steps from the initial weights: which parameters a batch uses depends on the data).
    initial, fresh_optimizer = refs.initial, refs.fresh_optimizer_state()
    for n in sorted({n for _, n in options.runs()} | {1}):
        for plan in (plans["plain"], plans["uneven"]):
            for step in range(1, plan.steps + 1):
                unused = refs.step(initial, fresh_optimizer, plan, step, n, torch.float32).unused
                traits.unused.extend(sorted(set(unused) - set(traits.unused)))
    for finding in _findings(spec, traits, refs, plans["plain"], options):
        add(finding)
    skip_exact = ("the model draws random numbers in forward beyond dropout: the runs cannot be compared exactly"
                  if traits.other_randomness else None)

    blob, rank_failure = _spec_blob(spec)  # rank_failure: why no rank run can start (the spec cannot reach the ranks)
    ranks = None
    if not rank_failure and any(name in RANK_STRATEGIES for name, _ in options.runs()):
        jobs = {}
        for name, n in options.runs():
            if name in RANK_STRATEGIES:
                jobs.setdefault(n, []).append(name)
        ranks = _RankRuns({n: RankJob(tuple(names), spec.source, dict(spec.options), blob, snapshot(model),
                                      list(plans.values()), options, find_unused=bool(traits.unused),
                                      dropout_calls=bool(traits.dropout_calls))
                           for n, names in sorted(jobs.items(), reverse=True)},  # the most ranks first: the longest
                          options, say)
    _run_and_judge(spec, model, options, plans, refs, traits, skip_exact, ranks, rank_failure, add, repro)
    order = {run: i for i, run in enumerate(options.runs())}  # the report in the options' order, as judged or not
    results.sort(key=lambda r: -1 if r.strategy is None else order.get((r.strategy, r.devices), len(order)))
    report = Report(spec.name, options, results, seconds=time.perf_counter() - start_time, notes=_notes(options))
    return report


def _run_and_judge(spec, model, options, plans, refs, traits, skip_exact, ranks, rank_failure, add, repro) -> None:
    """Each strategy and device count: its runs (in this process, or the ranks' from `ranks`), judged.
    Rank runs whose ranks have finished go first, in-process runs fill the time until they do."""
    pending = list(options.runs())
    while pending:
        name, n = next((run for run in pending if run[0] in RANK_STRATEGIES and ranks and ranks.ready(run[1])),
                       next((run for run in pending if run[0] not in RANK_STRATEGIES), pending[0]))
        pending.remove((name, n))
        if name in RANK_STRATEGIES and rank_failure:
            add(CheckResult("all", name, n, "skipped", rank_failure))
            continue
        per_plan = ranks.get(name, n) if name in RANK_STRATEGIES else None
        if isinstance(per_plan, str):
            add(CheckResult("all", name, n, "fail", per_plan, reproduce=repro(name, n, plans["plain"])))
            continue
        recs = {}
        try:
            for kind, plan in plans.items():
                if name in RANK_STRATEGIES:
                    recs[kind] = _rank_recording(per_plan[list(plans).index(kind)])
                else:
                    recs[kind] = _run_in_process(spec, model, name, n, plan, options)
        except MgpuError:
            raise
        except Exception as e:  # the model or the strategy crashed: that run fails, the others go on
            add(CheckResult("all", name, n, "fail", f"the run crashed: {_shortened(one_line(e, with_type=True))}",
                            reproduce=repro(name, n, plans["plain"])))
            continue
        _judge(name, n, recs, plans, refs, traits, skip_exact, add, repro)


def _shortened(text: str, most: int = 400) -> str:
    """A crash's one-line message cut to `most` characters: inductor's compile errors hold the whole
    generated C++ (tens of kilobytes), which would fill the report's row."""
    return text if len(text) <= most else text[:most] + " ..."


class _RankRuns:
    """The ddp and fsdp runs of a check: one spawn per world size, both strategies in it, started at
    once in a thread of their own. Meanwhile the launching process (one thread: run_check) makes the
    in-process runs and computes the references, rather than wait with a core idle while the ranks
    start and load the model's libraries. A check that ends early (Ctrl-C, a hanging model in this
    process) does not wait for the thread: it is a daemon, its spawn ends at its deadline, and the
    ranks die with this process (mgpu.launch)."""

    def __init__(self, jobs: dict, options: CheckOptions, say):
        self.options, self.say, self.results = options, say, {}
        self.thread = threading.Thread(target=self._run_all, args=(jobs,), name="mgpu-check-ranks", daemon=True)
        self.done = {n: threading.Event() for n in jobs}
        self.thread.start()

    def _run_all(self, jobs: dict) -> None:
        for n, job in jobs.items():
            try:
                self.results[n] = self._run(job, n)
            except BaseException as e:  # CheckTimeout, SpecError, ...: raised where the results are read
                self.results[n] = e
            finally:
                self.done[n].set()

    def _run(self, job: RankJob, n: int) -> dict:
        """{strategy: [plan][rank] recordings, or why its run crashed}. When the joint spawn fails, each
        strategy is spawned alone again, so that the crash is told to the strategy that made it."""
        self.say(f"check: {' and '.join(_label(s, n) for s in job.strategies)}: starting {n} ranks")
        try:
            return _spawn_ranks(job, n, self.options)
        except LaunchError as e:
            if len(job.strategies) == 1:
                return {job.strategies[0]: f"the run crashed: {str(e).splitlines()[0]}"}
        out = {}
        for name in job.strategies:
            out.update(self._run(replace(job, strategies=(name,)), n))
        return out

    def ready(self, n: int) -> bool:
        return self.done[n].is_set()

    def get(self, name: str, n: int):
        self.done[n].wait()
        result = self.results[n]
        if isinstance(result, BaseException):
            raise result
        return result[name]



def _rank_recording(per_rank: list[Recording]) -> Recording:
    """One Recording whose replicas are the ranks."""
    first = per_rank[0]
    return Recording(states=[[rec.states[s][0] for rec in per_rank] for s in range(len(first.states))],
                     grads=[rec.grads[0] for rec in per_rank], optimizer_states=first.optimizer_states, stats=first.stats,
                     ties=[rec.ties[0] for rec in per_rank], shards=first.shards * len(per_rank))


def _spawn_ranks(job: RankJob, n: int, options: CheckOptions):
    from mgpu.launch import spawn

    steps = sum(p.steps + 1 for p in job.plans) * len(job.strategies)
    deadline = None if options.step_timeout is None else 60.0 + steps * options.step_timeout
    try:
        return pickle.loads(spawn(rank_main, job, nprocs=n, deadline_s=deadline))
    except LaunchError as e:
        text = str(e)
        if "CheckTimeout" in text.splitlines()[0]:
            raise CheckTimeout(text.splitlines()[0].split("CheckTimeout: ", 1)[-1]) from None
        if "SpecError" in text.splitlines()[0]:
            raise SpecError(text.splitlines()[0].split("SpecError: ", 1)[-1]) from None
        raise


def _judge(name, n, recs, plans, refs, traits, skip_exact, add, repro) -> None:
    for kind in ("plain", "uneven", "accumulate"):
        plan, rec = plans[kind], recs[kind]
        if kind == "plain":
            start, initial = None, refs.initial
            for r, state in enumerate(rec.states[0]):
                start = start or compare_bitwise(state, initial, 0, r, against="the model as built (rank 0's seed)")
            add(_result("start", name, n, start, {}, repro(name, n, plan),
                        cause="the replicas do not start from the same weights and buffers"))
            replicas = _replicas_agree(rec)
            cause = None
            if replicas and replicas.tensor.startswith("buffer "):
                buf = replicas.tensor.split(" ", 1)[1]
                cause = f"buffer {buf} is not synchronised between {'ranks' if name in RANK_STRATEGIES else 'replicas'}"
            add(_result("replicas", name, n, replicas, {}, repro(name, n, plan), cause=cause))
            if traits.ties:
                untied = next(((r, t) for r, t in enumerate(rec.ties) if t != traits.ties), None)
                div = None if untied is None else Divergence(
                    None, "tied weights " + " = ".join(traits.ties[0]), untied[0], float("inf"), float("inf"), 0.0,
                    f"the model as built, where they are one tensor (now: {untied[1] or 'none tied'})")
                add(_result("ties", name, n, div, {}, repro(name, n, plan), cause="tied weights came apart"))
        if skip_exact:
            for check in (("gradients", "weights", "buffers", "optimizer", "statistics") if kind == "plain" else (kind,)):
                add(CheckResult(check, name, n, "skipped", skip_exact))
            continue
        # The single-device run is the whole batch at once, unless the model mixes the examples of a
        # batch or takes branches by what a batch holds (unused parameters): then it is the same
        # shards, one after the other, the first device's buffers kept.
        shards = rec.shards if traits.mixing or traits.unused else 1
        for check, div, errs in refs.compared(kind, rec, plan, shards):
            if div == "none":
                add(CheckResult(check, name, n, "skipped", NO_BUFFERS))
                continue
            cause = traits.mean_loss if div is not None and traits.mean_loss else None
            if div is not None and div.tensor.startswith("buffer ") and div.tensor[7:] in traits.changed_buffers:
                buf = div.tensor[7:]
                how = (f" (reassigned: self.{buf.rpartition('.')[2]} = ...)" if buf in traits.reassigned_buffers else "")
                cause = (f"buffer {buf} is computed from the batch in forward{how}: each device computes it from its "
                         "own shard and the first device's is kept, so it is not the single-device value; make it a "
                         "statistic of the global batch (all_reduce it), or keep it out of the model's state")
            add(_result(check, name, n, div, errs, repro(name, n, plan), cause=cause))


def _result(check, name, n, div, errs, reproduce, cause=None) -> CheckResult:
    if div is None:
        return CheckResult(check, name, n, "pass", errors=errs)
    return CheckResult(check, name, n, "fail", reason=cause or "", errors=errs, first_divergence=div,
                       reproduce=reproduce)


def _findings(spec, traits: Traits, refs: _Refs, plan: Plan, options: CheckOptions) -> list[CheckResult]:
    out = []
    if traits.unused:
        out.append(CheckResult("unused-parameters", None, None, "finding", (
            f"parameters with no gradient in some steps or on some devices: {_listed(traits.unused)}: DDP stops with 'Expected to have finished reduction' unless find_unused_parameters=True "
              "(the ddp runs here used it); remove the parameters if they are never used, or keep the flag (it costs "
              "a graph traversal per step)")))
    if traits.dropout or traits.dropout_calls:
        parts = ([f"{len(traits.dropout)} dropout module(s) ({_listed(traits.dropout)})"] if traits.dropout else [])
        parts += [f"{count} call(s) to {call} in each forward" for call, count in sorted(traits.dropout_calls.items())]
        out.append(CheckResult("random-layers", None, None, "finding", (
            f"dropout switched off for every check: {'; '.join(parts)}. With it on, each device draws its own "
            "masks: parity can then only be statistical, not exact")))
    if traits.other_randomness:
        out.append(CheckResult("randomness", None, None, "finding", (
            "the forward draws random numbers outside dropout layers (two forwards of the same input differ): the "
            "comparisons with single-device training are skipped; make the randomness a module mgpu can switch "
            "off, or seed it from the input")))
    if traits.mixing:
        n = max(options.devices)
        ref_whole, ref_sharded = refs.get(plan, 1, torch.float64), refs.get(plan, n, torch.float64)
        worst = _worst(error(ref_sharded.states[-1][0][k], v) for k, v in ref_whole.states[-1][0].items()
                       if k.startswith("weight ") and v.is_floating_point())
        kinds = {name: type(m).__name__ for name, m in refs.model.named_modules()}
        layers = _listed([f"{name} ({kinds.get(name, '?')}{_through(traits, refs.model, name)})"
                          for name in traits.mixing_layers]) or f"(the model as a whole{_through(traits, refs.model, '')})"
        out.append(CheckResult("batch-mixing", None, None, "finding", (
            f"layers mix the examples of a batch: {layers}. On N devices each computes over its shard, which is by "
            f"design not the whole batch's computation: the checks compare with the single-device run over the same "
            f"shards. After {plan.steps} steps on {n} shards the weights differ from the unsharded run by up to "
            f"{worst['max_abs']:.2e} (relative {worst['max_rel']:.2e}); SyncBatchNorm (ddp --sync-bn, CUDA) computes "
            "over the global batch"), errors=worst))
    if traits.changed_buffers and not traits.mixing:
        reassigned = [b for b in traits.changed_buffers if b in traits.reassigned_buffers]
        out.append(CheckResult("forward-buffers", None, None, "finding", (
            f"buffers written by a training forward: {_listed(traits.changed_buffers)}"
            + (f" (reassigned: {_listed(reassigned)})" if reassigned else "")
            + ": each device writes them from its own shard; mgpu's strategies copy the first device's after every "
              "step, torch's DDP at the start of the next forward (it re-reads reassigned buffers), so after the last "
              "step torch's DDP ranks hold different values; where they depend on the batch, the buffers check "
              "fails")))
    if traits.mean_loss:
        out.append(CheckResult("loss-not-a-sum", None, None, "finding", traits.mean_loss))
    return out


def _through(traits: Traits, model: torch.nn.Module, module: str) -> str:
    """", through buffer B, ..." when the mixing module (or the model, "") owns buffers that its training
    forward writes, other than BatchNorm's statistics (BatchNorm mixes through its batch statistics,
    which it does not keep): a buffer computed from the batch and read in the same forward mixes
    the examples, and it is the cause to name."""
    norms = {name for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)}
    prefix = f"{module}." if module else ""
    buffers = [b for b in traits.changed_buffers if b.startswith(prefix) and b.rpartition(".")[0] not in norms]
    return (f", through buffer{'s' if len(buffers) > 1 else ''} {_listed(buffers)}, which forward writes from the batch"
            if buffers else "")


def _notes(options: CheckOptions) -> list[str]:
    from mgpu import devices as devmod

    notes = []
    if options.compile:
        notes.append("--compile: every strategy's model ran under torch.compile (inductor; DDP and FSDP compiled with "
                     "their wrappers), compared with the eager single-device references")
    if options.device == "cpu" and devmod.gpu_count():
        notes.append(f"--device cpu: every run on the CPU beside {devmod.gpu_count()} CUDA device(s): manual on "
                     "emulated CPU devices, ddp and fsdp on gloo processes, dataparallel as a pass-through")
    elif devmod.gpu_count() < max(options.devices) and options.device != "cuda":
        notes.append(f"{max(options.devices)} devices asked, {devmod.gpu_count()} CUDA device(s) found: manual "
                     "runs on emulated CPU devices, ddp on gloo processes, dataparallel as a pass-through on one CPU "
                     "device (nn.DataParallel needs CUDA)")
    return notes


def _reproducer(spec: ModelSpec, options: CheckOptions):
    def command(strategy: str, n: int, plan: Plan) -> str:
        parts = ["python", "-m", "mgpu", "check", spec.source or "MODULE:FUNCTION"]
        for key in ("input_shape", "classes"):
            if key in spec.options:
                parts += [f"--{key.replace('_', '-')}", str(spec.options[key])]
        parts += ["--strategies", strategy, "--devices", str(n), "--batch-size", str(plan.batch_size),
                  "--steps", str(plan.steps), "--seed", str(plan.seed), "--accumulate", str(options.accumulate)]
        if options.device != "auto":
            parts += ["--device", options.device]
        if options.amp != "off":
            parts += ["--amp", options.amp]
        if options.compile:
            parts += ["--compile"]
        return " ".join(shlex.quote(p) for p in parts)
    return command


def check_data_parallel(spec: ModelSpec | str, strict: bool = False, input_shape=None, classes=None,
                        **options) -> Report:
    """For a user's own tests: run the check and raise ParityError (an AssertionError) naming the
    first divergence of the first failing check (with strict, a finding fails too, and so does a
    check whose comparisons were mostly skipped: Report.verified); else return
    the report. `spec` may be a ModelSpec, a `MODULE:FUNCTION` string, or `resnet18` / `lenet`."""
    if isinstance(spec, str):
        spec = builtin_spec(spec) if ":" not in spec else load_spec(spec, input_shape=input_shape, classes=classes)
    opts = replace(CheckOptions(), **options)
    report = run_check(spec, opts)
    failing = report.failures or (([] if report.verified else report.skipped_comparisons[:1]) + report.findings
                                  if strict else [])
    if failing:
        raise ParityError(failure_message(report, failing[0]), report)
    return report
