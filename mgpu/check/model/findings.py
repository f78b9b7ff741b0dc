"""What a check says in words besides its verdicts: findings about the model, notes about the run,
and the command that reproduces a failing run.

    findings(ctx)                      # [Finding]: unused parameters, dropout, ...
    notes(options)                     # ["--compile: every strategy's model ran under torch.compile ..."]
    reproducer(spec, options)("manual", 2, plan)   # "python -m mgpu check MODULE:FUNCTION --strategies manual ..."

A finding is the model's, not mgpu's: it does not fail the check unless --strict.
"""

from __future__ import annotations

import shlex

import torch

from mgpu import devices as devmod
from mgpu.check.findings import Finding
from mgpu.config import CheckOptions
from mgpu.check.model.compare import error, worst
from mgpu.check.model.judge import CheckContext
from mgpu.check.model.probe import Traits
from mgpu.check.model.record import RunPlan
from mgpu.spec import ModelSpec

__all__ = ["findings", "notes", "reproducer"]


def findings(ctx: CheckContext) -> list[Finding]:
    """The findings of the model's traits (ctx.traits, unused parameters included), in a fixed order."""
    traits, out = ctx.traits, []
    if traits.unused:
        out.append(Finding("unused-parameters", (
            f"parameters with no gradient in some steps or on some devices: {_listed(traits.unused)}: DDP stops with 'Expected to have finished reduction' unless find_unused_parameters=True "
              "(the ddp runs here used it); remove the parameters if they are never used, or keep the flag (it costs "
              "a graph traversal per step)")))
    if traits.dropout or traits.dropout_calls:
        parts = ([f"{len(traits.dropout)} dropout module(s) ({_listed(traits.dropout)})"] if traits.dropout else [])
        parts += [f"{count} call(s) to {call} in each forward" for call, count in sorted(traits.dropout_calls.items())]
        depth = any("stochastic" in call or "drop_path" in call for call in traits.dropout_calls)
        what = "dropout and stochastic depth" if depth else "dropout"
        out.append(Finding("random-layers", (
            f"{what} switched off for every check: {'; '.join(parts)}. With it on, each device draws its own "
            "masks: parity can then only be statistical, not exact")))
    if traits.other_randomness:
        out.append(Finding("randomness", (
            "the forward draws random numbers outside dropout layers (two forwards of the same input differ): the "
            "comparisons with single-device training are skipped; make the randomness a module mgpu can switch "
            "off, or seed it from the input")))
    if traits.mixing:
        out.append(_batch_mixing(ctx))
    if traits.changed_buffers and not traits.mixing:
        reassigned = [b for b in traits.changed_buffers if b in traits.reassigned_buffers]
        out.append(Finding("forward-buffers", (
            f"buffers written by a training forward: {_listed(traits.changed_buffers)}"
            + (f" (reassigned: {_listed(reassigned)})" if reassigned else "")
            + ": each device writes them from its own shard; mgpu's strategies copy the first device's after every "
              "step, torch's DDP at the start of the next forward (it re-reads reassigned buffers), so after the last "
              "step torch's DDP ranks hold different values; where they depend on the batch, the buffers check "
              "fails")))
    if traits.mean_loss:
        out.append(Finding("loss-not-a-sum", traits.mean_loss))
    return out


def _batch_mixing(ctx: CheckContext) -> Finding:
    """The layers that mix the examples of a batch, and how far the plain plan's weights on the most
    shards end from the unsharded run's."""
    traits, refs, plan, n = ctx.traits, ctx.refs, ctx.plans["plain"], max(ctx.options.devices)
    ref_whole, ref_sharded = refs.get(plan, 1, torch.float64), refs.get(plan, n, torch.float64)
    errors = worst(error(ref_sharded.states[-1][0][k], v) for k, v in ref_whole.states[-1][0].items()
                   if k.startswith("weight ") and v.is_floating_point())
    kinds = {name: type(m).__name__ for name, m in refs.model.named_modules()}
    layers = _listed([f"{name} ({kinds.get(name, '?')}{_through(traits, refs.model, name)})"
                      for name in traits.mixing_layers]) or f"(the model as a whole{_through(traits, refs.model, '')})"
    return Finding("batch-mixing", (
        f"layers mix the examples of a batch: {layers}. On N devices each computes over its shard, which is by "
        f"design not the whole batch's computation: the checks compare with the single-device run over the same "
        f"shards. After {plan.steps} steps on {n} shards the weights differ from the unsharded run by up to "
        f"{errors['max_abs']:.2e} (relative {errors['max_rel']:.2e}); SyncBatchNorm (ddp --sync-bn, CUDA) computes "
        "over the global batch"), errors=errors)


def _listed(names: list[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


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


def notes(options: CheckOptions) -> list[str]:
    """What the report says about how the runs ran: compiled, or on the CPU beside GPUs, or emulated."""
    out = []
    if options.compile:
        out.append("--compile: every strategy's model ran under torch.compile (inductor; DDP and FSDP compiled with "
                   "their wrappers), compared with the eager single-device references")
    if options.device == "cpu" and devmod.gpu_count():
        out.append(f"--device cpu: every run on the CPU beside {devmod.gpu_count()} CUDA device(s): manual on "
                   "emulated CPU devices, ddp and fsdp on gloo processes, dataparallel as a pass-through")
    elif devmod.gpu_count() < max(options.devices) and options.device != "cuda":
        out.append(f"{max(options.devices)} devices asked, {devmod.gpu_count()} CUDA device(s) found: manual "
                   "runs on emulated CPU devices, ddp on gloo processes, dataparallel as a pass-through on one CPU "
                   "device (nn.DataParallel needs CUDA)")
    return out


def reproducer(spec: ModelSpec, options: CheckOptions):
    """command(strategy, n, plan): the `python -m mgpu check` line that runs that one strategy and plan again."""
    def command(strategy: str, n: int, plan: RunPlan) -> str:
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
