"""Where a divergence enters the model: at the first step where world N's gradients (or weights) part
from world 1's, each module's output per example and the gradient that reaches the model's output,
world N against world 1.

    seconds = locate_failures(judgement, rerun)                      # sets WorldComparison.entered
    entered = locate(traced_a, traced_b, traced_n, kind)             # {"sentence": ..., "where": ...}

Only a comparison that failed at a gradient or a weight is located, so a passing check costs nothing:
a second, targeted run of world 1 (A, and its perturbed rerun B: the spread) and of the failing
world N, up to the step that diverged, with a tracer in every rank (tracer.py, ScriptRankJob.trace_step).

In a line: the traced runs; the examples of every traced forward (data.forward_digests, the step's own
rule); the figures, module by module per example (traced.py: the examples matched by digest, each
module's tolerance the core's rule); then their words, once (causes/entry.entered).

**The first difference** is the first event, in the order they happened, of a module's input (when
it is called) or output (when it returns) that is beyond its tolerance: an output whose input and
submodules' outputs agree is the module itself; an input that differs while everything before it
agrees is the code of the module that called it. Where every module agrees, the gradient at the
output says the rest: a common factor c per example (1: it agrees), with the optimizer's factor f,
tells the loss's reduction (f = c/N: averaged over the ranks, as DDP does, or f = c: summed) from
what happens after the backward (clipping, scaling, a reduction by another factor); a factor per
rank is a loss normalised per rank (causes/entry.py words what each shows).
"""

from __future__ import annotations

import math
import tempfile
import time

from mgpu.check.script.causes.entry import entered
from mgpu.check.script.data import forward_digests  # the step's own rule for examples
from mgpu.check.script.traced import figures_of

__all__ = ["locate", "locate_failures", "traced_runs", "LOCATED"]

# The divergences located: those that the model's forward, the loss or the backward can cause (an
# update or weight that parts while the gradients agree is told apart: the optimizer).
LOCATED = ("gradient", "update", "weight")


# -- the traced runs ---------------------------------------------------------------------------------------

def traced_runs(rerun, run_n, step: int, cache: dict) -> tuple:
    """World 1's A and B and world N (as `run_n` ran: device, lifted) again up to `step`, traced, by `rerun`
    (launch.run_world for the plan); world 1's runs shared through `cache` between world sizes that failed at
    the same step."""
    from mgpu.check.script.plan import PlannedRun

    out = []
    with tempfile.TemporaryDirectory(prefix="mgpu-locate-") as folder:
        for planned in (PlannedRun(1, "A", run_n.device, run_n.lifted), PlannedRun(1, "B", run_n.device, run_n.lifted),
                        PlannedRun(run_n.world, "", run_n.device, run_n.lifted)):
            key = (planned, step)
            if key not in cache:
                cache[key] = rerun(planned, folder, trace_step=step)
            out.append(cache[key])
    return tuple(out)


def locate_failures(judgement, rerun) -> float:
    """For each world size whose comparison failed at a gradient or a weight (its float32 comparison
    where there are two): where the divergence enters, as `comparison.entered`, from traced runs made by
    `rerun` (launch.run_world for the plan). The seconds it took (0.0 where nothing failed so: nothing runs)."""
    started = time.time()
    compared, comparisons = judgement.compared, judgement.comparisons
    if len(compared) != len(comparisons):
        return 0.0
    chosen: dict = {}
    for run, c in zip(compared, comparisons):
        if c.status == "fail" and c.first is not None and c.first.kind in LOCATED:
            if run.world not in chosen or (run.lifted and not chosen[run.world][0].lifted):
                chosen[run.world] = (run, c)
    if not chosen:
        return 0.0
    cache: dict = {}
    for run, c in chosen.values():
        a, b, n = traced_runs(rerun, run, c.first.step, cache)
        failed = next((r for r in (a, b, n) if r.failure is not None), None)
        if failed is not None:
            c.entered = {"sentence": f"not located: the traced run of {failed.name} failed: {failed.failure.message}",
                         "where": "unknown"}
            continue
        try:
            c.entered = locate(a, b, n, c.first.kind)
        except Exception as e:  # noqa: BLE001 - where it enters is an aid: the verdict stands without it
            c.entered = {"where": "unknown", "sentence": f"not located: {type(e).__name__}: {e}"}
        c.entered["step"] = c.first.step
    return time.time() - started


def _traced(run) -> list:
    """Each rank's traced forwards (empty where the step was not reached)."""
    return [r.trace.forwards if r.trace is not None and r.trace.complete else [] for r in run.ranks]


def locate(run_a, run_b, run_n, kind: str = "gradient") -> dict:
    """Where world N (run_n, traced) first parts from world 1 (run_a; run_b its perturbed rerun, the
    spread) in the traced step: a JSON-able record with its one-sentence `sentence`."""
    a_fw, b_fw = _traced(run_a)[0], _traced(run_b)[0]
    n_fw = _traced(run_n)
    if not a_fw or not any(n_fw):
        return {"where": "unknown", "sentence": "not located: the traced runs recorded no training forward of the step"}
    digests = forward_digests([f.data for f in a_fw], [[f.data for f in fs] for fs in n_fw], run_n.world,
                              [f.data for f in b_fw])
    truncated = any(r.trace is not None and r.trace.truncated for run in (run_a, run_n) for r in run.ranks)
    figures = figures_of((a_fw, b_fw, n_fw), digests, (run_a, run_n), kind, truncated)
    record = entered(figures)
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
