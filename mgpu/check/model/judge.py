"""Judging a strategy's runs: each check's verdict, against the single-device references.

    ctx = CheckContext(spec, model, options, plans, traits, References(spec, model, options), reproduce, say)
    judge_run(ctx, "manual", 2, {"plain": rec, "uneven": rec2, "accumulate": rec3})   # results go to ctx.add

For each run, in this order: `start` (every replica starts from the model as built), `replicas`
(bitwise equal to replica 0 at every step), `ties`; then, step by step against the reference
(`compare_run`): gradients, weights, buffers, optimizer state and the reported statistics; and the
`uneven` and `accumulate` runs as a whole. `References` computes each reference once and caches it,
and caches a run's comparison by the recording's digest.
"""

from __future__ import annotations

import copy
import enum
import functools
import hashlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from mgpu.config import CheckOptions
from mgpu.check.model.compare import ModelDivergence, compare_bitwise, compare_to_reference, error, worst
from mgpu.check.model.plans import label, make_optimizer, run_device
from mgpu.check.model.probe import Traits
from mgpu.check.model.record import (Arithmetic, RunPlan, Recording, ReferenceSetup, reference_run, reference_step, snapshot,
                                state_digest)
from mgpu.check.model.report import NO_BUFFERS, CheckResult
from mgpu.spec import ModelSpec
from mgpu.strategies import RANK_STRATEGIES

__all__ = ["CheckContext", "References", "NothingToCompare", "NOTHING_TO_COMPARE", "judge_run", "compare_run",
           "recording_digest", "named_optimizer_state"]


class NothingToCompare(enum.Enum):
    """A comparison that had nothing to compare (a model without buffers): skipped, neither passed nor failed."""

    NOTHING_TO_COMPARE = "nothing to compare"


NOTHING_TO_COMPARE = NothingToCompare.NOTHING_TO_COMPARE


@dataclass
class References:
    """Reference recordings, computed once per (plan, device count, dtype)."""

    spec: ModelSpec
    model: torch.nn.Module
    options: CheckOptions
    cache: dict = field(default_factory=dict)
    comparisons: dict = field(default_factory=dict)  # (kind, plan, shards, recording's digest) -> compare_run's

    def compared(self, kind: str, rec: Recording, plan: RunPlan, shards: int) -> list:
        """compare_run(kind, rec, ...), computed once for bitwise equal recordings: on the CPU,
        nn.DataParallel on 2 and on 3 devices is the same pass-through run, and its reference steps
        (most of a check's time for a large model) need not be taken twice."""
        key = (kind, plan, shards, recording_digest(rec))
        if key not in self.comparisons:
            self.comparisons[key] = compare_run(kind, rec, self, plan, shards)
        return self.comparisons[key]

    def fresh_optimizer_state(self) -> dict:
        return make_optimizer(self.options, self.spec)(list(copy.deepcopy(self.model).parameters())).state_dict()

    @functools.cached_property
    def initial(self) -> dict:
        return snapshot(self.model)

    def step(self, state: dict, optimizer_state: dict, plan: RunPlan, step: int, n: int, dtype, device="cpu",
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

    @functools.cached_property
    def setup(self) -> ReferenceSetup:
        return ReferenceSetup(self.spec, self.model, make_optimizer(self.options, self.spec), self.options.step_timeout)

    def _step(self, state, optimizer_state, plan, step, n, dtype, device, amp):
        arithmetic = Arithmetic(dtype, device, torch.bfloat16 if amp == "bf16" else None)
        return reference_step(self.setup, state, optimizer_state, plan, step, n, arithmetic)

    def get(self, plan: RunPlan, n: int, dtype) -> Recording:
        key = (plan, n, dtype)
        if key not in self.cache:
            self.cache[key] = reference_run(self.setup, plan, n, dtype)
        return self.cache[key]


@dataclass
class CheckContext:
    """What every part of one check reads (the spec, the model as built and probed, the options,
    the plans, the references) and where its results go (`add`). check.py makes it."""

    spec: ModelSpec
    model: torch.nn.Module
    options: CheckOptions
    plans: dict[str, RunPlan]
    traits: Traits
    refs: References
    reproduce: Callable[[str, int, RunPlan], str]  # the command that reproduces a run (findings.reproducer)
    say: Callable[[str], None]                  # a progress line
    runs: tuple = ()                            # (strategy, devices) to run, in the options' order (ModelCheckPlan.runs)
    skip_exact: str | None = None               # why no run can be compared with the references, if none can
    results: list[CheckResult] = field(default_factory=list)

    def add(self, result: CheckResult) -> None:
        self.results.append(result)
        where = "" if result.strategy is None else f" {label(result.strategy, result.devices)}:"
        detail = f" ({result.first_divergence.describe()})" if result.first_divergence else ""
        self.say(f"check:{where} {result.name}: {result.status}{detail}")


# -- judging a strategy's runs ------------------------------------------------------------------------

def judge_run(ctx: CheckContext, name: str, n: int, recs: dict[str, Recording]) -> None:
    """Every check of strategy `name` on n devices from its runs ({plan kind: recording}), into ctx.add."""
    for kind in ("plain", "uneven", "accumulate"):
        plan, rec = ctx.plans[kind], recs[kind]
        reproduce = ctx.reproduce(name, n, plan)
        if kind == "plain":
            _judge_replicas(ctx, name, n, rec, reproduce)
        if ctx.skip_exact:
            for check in (("gradients", "weights", "buffers", "optimizer", "statistics") if kind == "plain" else (kind,)):
                ctx.add(CheckResult(check, name, n, "skipped", ctx.skip_exact))
            continue
        # The single-device run is the whole batch at once, unless the model mixes the examples of a
        # batch or takes branches by what a batch holds (unused parameters): then it is the same
        # shards, one after the other, the first device's buffers kept.
        shards = rec.shards if ctx.traits.mixing or ctx.traits.unused else 1
        for check, div, errs in ctx.refs.compared(kind, rec, plan, shards):
            if div is NOTHING_TO_COMPARE:
                ctx.add(CheckResult(check, name, n, "skipped", NO_BUFFERS))
                continue
            ctx.add(_result(check, name, n, div, errs, reproduce, cause=_cause(ctx.traits, div)))


def _judge_replicas(ctx: CheckContext, name: str, n: int, rec: Recording, reproduce: str) -> None:
    """start, replicas and ties: the replicas (or ranks) against the model as built and each other."""
    start, initial = None, ctx.refs.initial
    for r, state in enumerate(rec.states[0]):
        start = start or compare_bitwise(state, initial, 0, r, against="the model as built (rank 0's seed)")
    ctx.add(_result("start", name, n, start, {}, reproduce,
                    cause="the replicas do not start from the same weights and buffers"))
    replicas = _replicas_agree(rec)
    cause = None
    if replicas and replicas.tensor.startswith("buffer "):
        buf = replicas.tensor.split(" ", 1)[1]
        cause = f"buffer {buf} is not synchronised between {'ranks' if name in RANK_STRATEGIES else 'replicas'}"
    ctx.add(_result("replicas", name, n, replicas, {}, reproduce, cause=cause))
    ties = ctx.traits.ties
    if ties:
        untied = next(((r, t) for r, t in enumerate(rec.ties) if t != ties), None)
        div = None if untied is None else ModelDivergence(
            None, tensor="tied weights " + " = ".join(ties[0]), rank=untied[0], max_abs=float("inf"),
            max_rel=float("inf"), allowed=0.0,
            against=f"the model as built, where they are one tensor (now: {untied[1] or 'none tied'})")
        ctx.add(_result("ties", name, n, div, {}, reproduce, cause="tied weights came apart"))


def _cause(traits: Traits, div: ModelDivergence | None) -> str | None:
    """What the model's traits say about a divergence from the reference: a mean loss, or a buffer
    computed from the batch."""
    cause = traits.mean_loss if div is not None and traits.mean_loss else None
    if div is not None and div.tensor.startswith("buffer ") and div.tensor[7:] in traits.changed_buffers:
        buf = div.tensor[7:]
        how = (f" (reassigned: self.{buf.rpartition('.')[2]} = ...)" if buf in traits.reassigned_buffers else "")
        cause = (f"buffer {buf} is computed from the batch in forward{how}: each device computes it from its "
                 "own shard and the first device's is kept, so it is not the single-device value; make it a "
                 "statistic of the global batch (all_reduce it), or keep it out of the model's state")
    return cause


def _result(check, name, n, div, errs, reproduce, cause=None) -> CheckResult:
    if div is None:
        return CheckResult(check, name, n, "pass", errors=errs)
    return CheckResult(check, name, n, "fail", reason=cause or "", errors=errs, first_divergence=div,
                       reproduce=reproduce)


def _replicas_agree(rec: Recording) -> ModelDivergence | None:
    """Every replica/rank bitwise equal to replica 0 at every step (start included)."""
    for s, states in enumerate(rec.states):
        for r in range(1, len(states)):
            div = compare_bitwise(states[r], states[0], s, r)
            if div:
                return div
    return None


# -- comparing a run with the references --------------------------------------------------------------

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


def named_optimizer_state(state_dict: dict, names: list[str]) -> dict:
    """An optimizer's state_dict as {"param name: key": tensor} (parameters in `names` order)."""
    out = {}
    for index, state in state_dict.get("state", {}).items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                out[f"{names[index]}: {key}"] = value
    return out


def compare_run(kind: str, rec: Recording, refs: References, plan: RunPlan,
                n: int) -> list[tuple[str, ModelDivergence | NothingToCompare | None, dict]]:
    """(check name, first divergence, None, or NOTHING_TO_COMPARE; worst errors) for one strategy run.

    Step by step: step s of the run is compared with one reference step (float64; float32 for the
    error's scale) taken from the run's own state entering step s (replica 0's weights, buffers and
    optimizer state). Errors then cannot pile up over steps, and a ReLU that a float32 rounding
    flips in one run and not in another cannot make a correct run look wrong; a bug shows in the
    step where it happens.
    """
    names = [name for name, _ in refs.model.named_parameters()]
    steps = _reference_steps(rec, refs, plan, n)
    if kind == "plain":
        buffers = (_compare_states(rec, steps, "buffer ") if any(k.startswith("buffer ") for k in rec.states[0][0])
                   else (NOTHING_TO_COMPARE, {}))
        return [("gradients", *_compare_gradients(rec, steps)), ("weights", *_compare_states(rec, steps, "weight ")),
                ("buffers", *buffers), ("optimizer", *_compare_optimizer(rec, steps, names)),
                ("statistics", *_compare_statistics(rec, steps))]
    div, errs = _compare_gradients(rec, steps) if kind == "uneven" else (None, {})
    div2, errs2 = _compare_states(rec, steps, "")
    return [(kind, div or div2, worst([(errs.get("max_abs", 0.0), errs.get("max_rel", 0.0)),
                                       (errs2["max_abs"], errs2["max_rel"])]))]


def _reference_steps(rec: Recording, refs: References, plan: RunPlan, n: int) -> list[tuple]:
    """[(float64 step, float32 step)] for each step s, each from the run's state entering step s."""
    # The float32 step that sizes the error runs where the checked run did (the first GPU when n
    # GPUs exist): a GPU's kernels round differently from a CPU's; sized by the CPU's float32,
    # LeNet's first-step gradients on one H200 were 3.4 times past what is allowed
    # (docs/design/check-tolerance.md, "Why on the run's device").
    where = run_device(n, refs.options.device)
    steps = []
    for s in range(1, plan.steps + 1):
        state, opt = rec.states[s - 1][0], rec.optimizer_states[s - 1]
        # Under --amp bf16 the step that sizes the error is the single-device bf16 step: what a correct
        # run's own rounding is then. The value stays the float64 step's.
        steps.append((refs.step(state, opt, plan, s, n, torch.float64),
                      refs.step(state, opt, plan, s, n, torch.float32, device=where, amp=refs.options.amp)))
    return steps


def _compare_gradients(rec: Recording, steps: list) -> tuple[ModelDivergence | None, dict]:
    first64, first32 = steps[0]
    div, pairs = None, []
    for r in range(len(rec.states[0])):
        div = div or compare_to_reference(rec.grads[r], first64.grads, first32.grads, 1, r, prefix="gradient ")
        pairs += [error(rec.grads[r][k], g) for k, g in first64.grads.items()
                  if g is not None and rec.grads[r].get(k) is not None]
    return div, worst(pairs)


def _only(state: dict, kind: str) -> dict:
    return {k: v for k, v in state.items() if k.startswith(kind)}


def _compare_states(rec: Recording, steps: list, kind_prefix: str) -> tuple[ModelDivergence | None, dict]:
    div, pairs = None, []
    for s, (r64, r32) in enumerate(steps, start=1):
        got = _only(rec.states[s][0], kind_prefix)
        div = div or compare_to_reference(got, _only(r64.state, kind_prefix), _only(r32.state, kind_prefix), s, 0)
        pairs += [error(got[k], v) for k, v in _only(r64.state, kind_prefix).items()
                  if v.is_floating_point() and k in got]
    return div, worst(pairs)


def _compare_optimizer(rec: Recording, steps: list, names: list[str]) -> tuple[ModelDivergence | None, dict]:
    div, pairs = None, []
    for s, (r64, r32) in enumerate(steps, start=1):
        got = named_optimizer_state(rec.optimizer_states[s], names)
        want = named_optimizer_state(r64.optimizer_state, names)
        div = div or compare_to_reference(got, want, named_optimizer_state(r32.optimizer_state, names), s, 0,
                                          prefix="optimizer state ")
        pairs += [error(got[k], v) for k, v in want.items() if k in got and v.is_floating_point()]
    return div, worst(pairs)


def _compare_statistics(rec: Recording, steps: list) -> tuple[ModelDivergence | None, dict]:
    for s, (r64, r32) in enumerate(steps, start=1):
        div = _compare_stats(s, rec.stats[s - 1], r64.stats, r32.stats)
        if div:
            return div, {}
    return None, {}


def _compare_stats(step: int, got: list, r64: list, r32: list) -> ModelDivergence | None:
    """The step's reported loss within tolerance, its count of correct examples the reference's."""
    as_t = lambda v: {"loss_sum": torch.tensor(v, dtype=torch.float64)}  # noqa: E731
    loss = compare_to_reference(as_t(got[0]), as_t(r64[0]), as_t(r32[0]), step, None, prefix="reported ")
    if loss:
        return loss
    if abs(got[1] - r64[1]) > 1e-6 and abs(got[1] - r32[1]) > 1e-6:
        return ModelDivergence(step, tensor="reported correct count", max_abs=abs(got[1] - r32[1]),
                          max_rel=abs(got[1] - r32[1]) / max(abs(r32[1]), 1e-12), allowed=0.0,
                          against=f"the count of correct examples of the single-device run ({r32[1]:g})")
    return None
