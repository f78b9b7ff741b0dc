"""`run_check(spec)`: a model under every strategy and device count, against single-device training.

    python -m mgpu check examples/tiny_lm.py:spec --devices 2,3 --json check.json
    >>> report = run_check(load_spec("examples/tiny_lm.py:spec"))
    >>> check_data_parallel(spec)          # in a pytest test: AssertionError with the first divergence

What it does, in order (docs/guide/check.md says what each check means), each step in a file of
its own:

1. validates the spec (bad input: SpecError) and probes the model (probe.py): random layers,
   layers that mix the examples of a batch, buffers its forward writes or reassigns, parameters
   some shards leave without a gradient, a loss that is a mean; the findings (findings.py);
2. runs each strategy for each device count (plans.py): a few steps on the same global batches
   (`plain`), again on a batch the device count does not divide (`uneven`), and with gradient
   accumulation (`accumulate`); in this process (record.py), or for ddp and fsdp in one spawn of
   ranks per world size, each rank building the model from a different seed (ranks.py);
3. judges each run against the single-device reference in float64 and float32 (judge.py, with
   compare.py's tolerances) and reports a `CheckResult` per check and strategy (report.py): pass,
   fail with the first divergence and a command that reproduces it, finding, or skipped (why).

Everything one check knows travels in one `CheckContext` (judge.py).
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from typing import Callable

import torch

from mgpu.check.findings import ZeroGradientWords, zero_gradients_finding
from mgpu.config import CHECK_STRATEGIES, CheckOptions
from mgpu.devices import exact_gpu_math, torch_threads
from mgpu.errors import MgpuError, SpecError, one_line
from mgpu.check.model.findings import findings, notes, reproducer
from mgpu.check.model.judge import CheckContext, References, judge_run
from mgpu.check.model.plans import label, make_optimizer, plan_check, strategy_for
from mgpu.check.model.probe import probe_model
from mgpu.check.model.ranks import ModelRankJob, RankRuns, rank_recording, spec_blob
from mgpu.check.model.record import RunPlan, Recording, record_strategy, snapshot
from mgpu.check.model.timeout import step_timeout
from mgpu.check.model.report import CheckResult, Report
from mgpu.spec import ModelSpec, builtin_spec, load_spec, validate_spec
from mgpu.strategies import RANK_STRATEGIES  # each run of these is a spawn of its ranks

__all__ = ["CheckOptions", "CheckResult", "Report", "run_check", "check_data_parallel", "run_in_process", "References",
           "CHECK_STRATEGIES"]


ZERO_GRADIENT_WORDS = ZeroGradientWords("of the single-device steps", "reference step(s) from the initial weights",
                                        "agrees under any strategy, so the comparisons proved nothing")


def run_check(spec: ModelSpec, options: CheckOptions | None = None,
              progress: Callable[[str], None] | None = None) -> Report:
    """Check `spec` under options.strategies x options.devices; see the module docstring.

    Bad input (the spec, the options) raises an MgpuError before anything runs; a model that hangs
    raises CheckTimeout naming the strategy and step. Parity failures are in the report.
    """
    # One thread: emulated devices run one after the other, and spinning threads only slow a busy
    # machine. Exact GPU math: TF32 would move a GPU's float32 far past the tolerances, and cuDNN's
    # default algorithms differ from run to run (docs/design/check-tolerance.md).
    with torch_threads(1), exact_gpu_math():
        return _run_check(spec, options, progress)


def _run_check(spec: ModelSpec, options: CheckOptions | None, progress) -> Report:
    start_time = time.perf_counter()
    options = (options or CheckOptions()).validate()
    if not isinstance(spec, ModelSpec):
        raise SpecError(f"run_check needs an mgpu.ModelSpec, got {type(spec).__name__} (load_spec('MODULE:FUNCTION') makes one)")
    if "fsdp" in options.strategies:
        from mgpu.strategies.fsdp import check_fsdp_supported

        check_fsdp_supported()
    ctx = _probed(spec, options, progress or (lambda line: None))
    for finding in findings(ctx):
        ctx.add(CheckResult.of_finding(finding))
    if ctx.traits.other_randomness:
        ctx.skip_exact = "the model draws random numbers in forward beyond dropout: the runs cannot be compared exactly"
    ranks, rank_failure = _start_rank_runs(ctx)
    _run_and_judge(ctx, ranks, rank_failure)
    order = {run: i for i, run in enumerate(ctx.runs)}  # the report in the options' order, as judged or not
    ctx.results.sort(key=lambda r: -1 if r.strategy is None else order.get((r.strategy, r.devices), len(order)))
    return Report(spec.name, options, ctx.results, seconds=time.perf_counter() - start_time, notes=notes(options))


def _probed(spec: ModelSpec, options: CheckOptions, say: Callable[[str], None]) -> CheckContext:
    """The check's context: the spec validated, the model built and probed, the references ready,
    the parameters that some device's shard leaves without a gradient found, and the zero-gradients
    finding when no step from the initial weights gives any parameter a gradient other than zero."""
    plan = plan_check(options)
    with step_timeout(options.step_timeout and 4 * options.step_timeout, f"{spec.name}: the first forwards (probing the model)"):
        validate_spec(spec, batch_size=min(options.batch_size, 4), seed=options.seed)
        model = spec.build_seeded(options.seed)
        traits = probe_model(spec, model, plan.plans["plain"], plan.probe_shards)
    refs = References(spec, model, options)
    # Unused parameters: some device's shard leaves them without a gradient on some step's batch
    # (float32 steps from the initial weights: which parameters a batch uses depends on the data).
    initial, fresh_optimizer = refs.initial, refs.fresh_optimizer_state()
    steps = []
    for n in sorted({n for _, n in plan.runs} | {1}):
        for kind in ("plain", "uneven"):
            for step in range(1, plan.plans[kind].steps + 1):
                steps.append(refs.step(initial, fresh_optimizer, plan.plans[kind], step, n, torch.float32))
                traits.unused.extend(sorted(set(steps[-1].unused) - set(traits.unused)))
    ctx = CheckContext(spec, model, options, plan.plans, traits, refs, reproducer(spec, options), say, runs=plan.runs)
    zero = zero_gradients_finding([ref.grads for ref in steps], ZERO_GRADIENT_WORDS)
    if zero is not None:
        ctx.add(CheckResult.of_finding(zero))
    return ctx


def _start_rank_runs(ctx: CheckContext) -> tuple[RankRuns | None, str | None]:
    """The rank runs, started in their thread (None when the check has none), and why none can
    start (the spec cannot reach the ranks), or None."""
    blob, rank_failure = spec_blob(ctx.spec)
    jobs: dict[int, list[str]] = {}
    for name, n in ctx.runs:
        if name in RANK_STRATEGIES:
            jobs.setdefault(n, []).append(name)
    if rank_failure or not jobs:
        return None, rank_failure
    spec, traits = ctx.spec, ctx.traits
    return RankRuns({n: ModelRankJob(tuple(names), spec.source, dict(spec.options), blob, snapshot(ctx.model),
                                list(ctx.plans.values()), ctx.options, find_unused=bool(traits.unused),
                                dropout_calls=bool(traits.dropout_calls))
                     for n, names in sorted(jobs.items(), reverse=True)},  # the most ranks first: the longest
                    ctx.options, ctx.say), None


def _run_and_judge(ctx: CheckContext, ranks: RankRuns | None, rank_failure: str | None) -> None:
    """Each strategy and device count: its runs (in this process, or the ranks' from `ranks`), judged.
    Rank runs whose ranks have finished go first, in-process runs fill the time until they do."""
    pending = list(ctx.runs)
    while pending:
        name, n = next((run for run in pending if run[0] in RANK_STRATEGIES and ranks and ranks.ready(run[1])),
                       next((run for run in pending if run[0] not in RANK_STRATEGIES), pending[0]))
        pending.remove((name, n))
        reproduce = ctx.reproduce(name, n, ctx.plans["plain"])
        if name in RANK_STRATEGIES and rank_failure:
            ctx.add(CheckResult("all", name, n, "skipped", rank_failure))
            continue
        per_plan = ranks.get(name, n) if name in RANK_STRATEGIES else None
        if isinstance(per_plan, str):
            ctx.add(CheckResult("all", name, n, "fail", per_plan, reproduce=reproduce))
            continue
        try:
            recs = _recordings(ctx, name, n, per_plan)
        except MgpuError:
            raise
        except Exception as e:  # the model or the strategy crashed: that run fails, the others go on
            ctx.add(CheckResult("all", name, n, "fail", f"the run crashed: {_shortened(one_line(e, with_type=True))}",
                                reproduce=reproduce))
            continue
        judge_run(ctx, name, n, recs)


def _recordings(ctx: CheckContext, name: str, n: int, per_plan: list | None) -> dict[str, Recording]:
    """{plan kind: the run's recording}: the ranks' (per_plan, [plan][rank]) or a run in this process."""
    recs = {}
    for kind, plan in ctx.plans.items():
        if name in RANK_STRATEGIES:
            recs[kind] = rank_recording(per_plan[list(ctx.plans).index(kind)])
        else:
            recs[kind] = run_in_process(ctx.spec, ctx.model, name, n, plan, ctx.options)
    return recs


def run_in_process(spec, model, name: str, n: int, plan: RunPlan, options: CheckOptions) -> Recording:
    """Strategy `name` on n devices in this process (not a rank strategy), `plan` recorded from a copy of `model`."""
    strategy = strategy_for(name, n, options)
    strategy.use_objective(spec.objective)
    strategy.setup(copy.deepcopy(model), make_optimizer(options, spec))
    try:
        return record_strategy(strategy, spec, plan, label=label(name, n), timeout_s=options.step_timeout)
    finally:
        strategy.teardown()


def _shortened(text: str, most: int = 400) -> str:
    """A crash's one-line message cut to `most` characters: inductor's compile errors hold the whole
    generated C++ (tens of kilobytes), which would fill the report's row."""
    return text if len(text) <= most else text[:most] + " ..."


def check_data_parallel(spec: ModelSpec | str, strict: bool = False, input_shape=None, classes=None,
                        accept_not_verified: bool = False, **options) -> Report:
    """For a user's own tests: run the check and raise ParityError (an AssertionError) naming the
    first divergence of the first failing check (with strict, a finding fails too); NotVerifiedError
    (a ParityError) when the check is NOT VERIFIED (its comparisons mostly skipped, or every gradient
    zero: Report.enough_compared), unless accept_not_verified; else return the report: the command's exit
    codes, as exceptions. `spec` may be a ModelSpec, a `MODULE:FUNCTION` string, or `resnet18` / `lenet`."""
    if isinstance(spec, str):
        spec = builtin_spec(spec) if ":" not in spec else load_spec(spec, input_shape=input_shape, classes=classes)
    opts = replace(CheckOptions(), **options)
    return run_check(spec, opts).raise_unless_accepted(strict, accept_not_verified)
