"""Where a divergence enters the model: at the first step where world N's gradients (or weights) part
from world 1's, each module's output per example and the gradient that reaches the model's output,
world N against world 1.

    seconds = locate_failures(judgement, rerun)                      # sets WorldComparison.entered
    entered = locate(traced_a, traced_b, traced_n, kind)             # {"sentence": ..., "where": ...}

Only a comparison that failed at a gradient or a weight is located, so a passing check costs nothing:
a second, targeted run of world 1 (A, and its perturbed rerun B: the spread) and of the failing
world N, up to the step that diverged, with a tracer in every rank (tracer.py, ScriptRankJob.trace_step).

**The examples** are matched across world sizes by their digests (data.py's rule: the data each
traced forward consumed, padding stripped), so a rank's rows of a module's output are compared with
world 1's rows of the same examples; a module's rows lie along the dimension whose size is its
forward's example count (dim 0 first). Where shapes differ beyond the batch (each rank pads its own
batch), the common extent is compared.

**The tolerance** is the check core's rule (mgpu/check/tolerance.py) per module: the spread is run
B's distance from run A on the same rows, the scale the largest element of world 1's rows, eps that
of their dtype.

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

import torch

from mgpu.check.tolerance import allowed_error, eps_of, error, largest
from mgpu.check.script.causes.entry import (forward_factors, module_input, module_output, no_output_factor,
                                            output_gradient_agrees, output_gradient_factor, output_gradient_missing,
                                            rank_factors)
from mgpu.check.script.data import _batch_dims, _pads, example_digests  # the step's own rule for examples
from mgpu.check.script.tensors import common_factor

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


# -- rows per example -------------------------------------------------------------------------------------

def _traced(run) -> list:
    """Each rank's traced forwards (empty where the step was not reached)."""
    return [r.trace.forwards if r.trace is not None and r.trace.complete else [] for r in run.ranks]


def _batch_rows(t: torch.Tensor, count: int) -> list | None:
    """A tensor's rows, one per example of its forward: along dim 0, else the first dimension of that size."""
    if t is None or t.dim() == 0:
        return None
    dim = 0 if t.shape[0] == count else next((d for d in range(t.dim()) if t.shape[d] == count), None)
    return None if dim is None else list(t.movedim(dim, 0))


def _rows(forwards: list, digests: list) -> tuple[dict, list, dict]:
    """key -> [(example digest, row, forward)] over a rank's traced forwards, the keys in the order
    they happened, and key -> module class name. A key is (root, label, "input" | "output" | "grad")."""
    rows: dict = {}
    order: list = []
    types: dict = {}
    for j, (f, ds) in enumerate(zip(forwards, digests)):
        items = [((f.root, e.label, e.kind), e.tensor) for e in f.events] + [((f.root, "", "grad"), f.output_grad)]
        for key, t in items:
            split = _batch_rows(t, len(ds))
            if split is None:
                continue
            if key not in rows:
                rows[key] = []
                order.append(key)
            types[key[:2]] = f.types.get(key[1], f.root)
            rows[key].extend((d, row, j) for d, row in zip(ds, split))
    return rows, order, types


def _pairs(reference: list, others: list) -> list:
    """(reference row, other row, (which, its forward)) for every example of `others` ([(which, rows)])
    that the reference holds, matched by digest, in order."""
    by_digest: dict = {}
    for d, row, _ in reference:
        by_digest.setdefault(d, []).append(row)
    used: dict = {}
    out = []
    for which, rows in others:
        for d, row, j in rows:
            i = used.get(d, 0)
            if i < len(by_digest.get(d, ())):
                out.append((by_digest[d][i], row, (which, j)))
                used[d] = i + 1
    return out


def _crop(a: torch.Tensor, b: torch.Tensor):
    """Both rows over their common extent (each rank pads its own batch); None for another rank of tensor."""
    if a.shape == b.shape:
        return a, b
    if a.dim() != b.dim():
        return None
    window = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, b.shape))
    return a[window], b[window]


def _distance(pairs: list) -> tuple[float, int]:
    """The largest absolute difference over the pairs (the core's error), and the pair where it is."""
    worst, where = 0.0, -1
    for i, (ref, other, _) in enumerate(pairs):
        cropped = _crop(ref, other)
        e = math.inf if cropped is None else error(cropped[1], cropped[0])[0]
        if not e <= worst:
            worst, where = e, i
    return worst, where


def _judged(key, ref: list, spread_rows: list, rows_n: list) -> dict | None:
    """One key's error against world 1 over every matched example, and its allowed error (the core's rule)."""
    pairs = _pairs(ref, rows_n)
    if not pairs:
        return None
    e, at = _distance(pairs)
    spread = _distance(_pairs(ref, [(None, spread_rows)]))[0] if spread_rows else 0.0
    scale = max(largest(r) for _, r, _ in ref)
    allowed = allowed_error(spread, scale, eps_of(ref[0][1]))
    return {"key": key, "error": e, "allowed": allowed, "rank": pairs[at][2][0] if at >= 0 else None,
            "examples": len(pairs), "pairs": pairs}


# -- what the rows show ------------------------------------------------------------------------------------

def _digests(a_fw: list, b_fw: list, n_fw: list, n: int) -> tuple:
    """Example digests of every traced forward: world 1's A and B (lists) and each rank's (list of lists)."""
    firsts = n_fw[0] if n_fw else []
    dims = _batch_dims([f.data for f in a_fw], [f.data for f in firsts], n)
    pads = _pads([f.data for f in a_fw + b_fw] + [f.data for fs in n_fw for f in fs], dims)
    digest = lambda forwards: [example_digests(f.data, dims, pads) for f in forwards]  # noqa: E731
    return digest(a_fw), digest(b_fw), [digest(fs) for fs in n_fw]


def _label(key, types: dict) -> str:
    root, label, _ = key
    kind = types.get(key[:2], root)
    return f"`{label}` ({kind})" if label else f"the model ({kind})"


def _grad_factor(run_a, run_n, step: int, kind: str) -> float | None:
    """The optimizer's gradients at `step`, world N's rank 0 against world 1's: their common factor
    (1 where the update or the weights diverged: the gradients agreed)."""
    if kind != "gradient":
        return 1.0
    recs_1, recs_n = run_a.ranks[0].steps, run_n.ranks[0].steps
    if len(recs_1) < step or len(recs_n) < step:
        return None
    return common_factor(recs_n[step - 1].grads, recs_1[step - 1].grads)


def _factor(pairs: list) -> float | None:
    """The common factor of world N's rows over world 1's, cropped and flattened together."""
    cropped = [c for c in (_crop(ref, other) for ref, other, _ in pairs) if c is not None]
    if not cropped:
        return None
    ref = torch.cat([a.double().flatten() for a, _ in cropped])
    got = torch.cat([b.double().flatten() for _, b in cropped])
    return common_factor({"g": got}, {"g": ref})


def _output_gradient(g: dict | None, f: float | None, n: int, kind: str,
                     truncated: bool = False) -> tuple[str, str, dict]:
    """(where, words, record) for the gradient at the model's output, where every module agrees: its
    factors per example, per rank, per forward, worded by causes/entry.py."""
    if g is None:
        return (*output_gradient_missing(truncated), {})
    if g["error"] <= g["allowed"]:
        return (*output_gradient_agrees(g["error"], g["allowed"], f, n, kind), {"output_gradient_factor": 1.0})
    c = _factor(g["pairs"])
    if c is not None:
        return (*output_gradient_factor(c, f, n, kind), {"output_gradient_factor": c})
    ranks = sorted({which for _, _, (which, _) in g["pairs"]})
    per_rank = [_factor([p for p in g["pairs"] if p[2][0] == r]) for r in ranks]
    if per_rank and None not in per_rank:
        return (*rank_factors(ranks, per_rank), {"rank_factors": per_rank})
    parts = sorted({which for _, _, which in g["pairs"]})
    per_part = [_factor([p for p in g["pairs"] if p[2] == part]) for part in parts]
    if len(parts) > len(ranks) and None not in per_part:
        return (*forward_factors(per_part), {"forward_factors": per_part})
    return (*no_output_factor(g["error"], g["allowed"]), {})


def locate(run_a, run_b, run_n, kind: str = "gradient") -> dict:
    """Where world N (run_n, traced) first parts from world 1 (run_a; run_b its perturbed rerun, the
    spread) in the traced step: a JSON-able record with its one-sentence `sentence`."""
    n = run_n.world
    a_fw, b_fw = _traced(run_a)[0], _traced(run_b)[0]
    n_fw = _traced(run_n)
    if not a_fw or not any(n_fw):
        return {"where": "unknown", "sentence": "not located: the traced runs recorded no training forward of the step"}
    da, db, dn = _digests(a_fw, b_fw, n_fw, n)
    rows_a, order, types = _rows(a_fw, da)
    rows_b = _rows(b_fw, db)[0]
    rows_n = [_rows(fs, ds)[0] for fs, ds in zip(n_fw, dn)]
    judged = {}
    for key in order:
        j = _judged(key, rows_a[key], rows_b.get(key, []), [(r, rows.get(key, [])) for r, rows in enumerate(rows_n)])
        if j is not None:
            judged[key] = j
    truncated = any(r.trace is not None and r.trace.truncated for run in (run_a, run_n) for r in run.ranks)
    record = {"world": n, "modules_compared": len({k[:2] for k in judged if k[2] != "grad"}),
              "truncated": truncated, "gradient_factor": _grad_factor(run_a, run_n, run_a.ranks[0].trace.step, kind)}
    first = next((j for k, j in judged.items() if k[2] != "grad" and not j["error"] <= j["allowed"]), None)
    if first is not None:
        return _module_entry(first, a_fw, types, record)
    agree = [j for k, j in judged.items() if k[2] == "output"]
    worst = max(agree, key=lambda j: j["error"] / j["allowed"] if j["allowed"] else 0.0, default=None)
    head = (f"every module's output agrees per example (largest error {worst['error']:.1e} of {worst['allowed']:.1e} "
            f"allowed, {len(agree)} modules)" if agree else "no module output was compared per example")
    where, words, extra = _output_gradient(judged.get((a_fw[0].root, "", "grad")), record["gradient_factor"], n, kind,
                                           truncated)
    record.update(extra, where=where)
    record["sentence"] = head + words + (" (the trace was cut short: TRACE_NUMEL)" if truncated else "")
    return _jsonable(record)


def _module_entry(first: dict, a_fw: list, types: dict, record: dict) -> dict:
    """The record where a module's input or output is the first difference."""
    key = first["key"]
    root, label, event = key
    parents = {k: v for f in a_fw for k, v in f.parents.items()}
    figures = f"error {first['error']:.2e}, allowed {first['allowed']:.2e}, on rank {first['rank']}"
    if event == "output":
        where, sentence = module_output(_label(key, types), any(p == label for p in parents.values()), figures)
    else:
        parent = parents.get(label)
        caller = _label((root, parent, "output"), types) if parent is not None else "the code that calls the model"
        where, sentence = module_input(_label(key, types), caller, figures)
    record.update(where=where, module=label, module_type=types.get(key[:2], root), error=first["error"],
                  allowed=first["allowed"], sentence=sentence)
    return _jsonable(record)


def _jsonable(record: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
