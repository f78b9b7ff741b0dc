"""The figures of a traced step (locate.py): each module's input and output per example, and the gradient that
reaches the model's output, world N against world 1, taken before anything is said of them (causes/entry.py
words them).

    figures = figures_of((a_fw, b_fw, n_fw), digests, (run_a, run_n), kind, truncated)   # EntryFigures

**The examples** are matched across world sizes by their digests (data.forward_digests), so a rank's rows of a
module's output are compared with world 1's rows of the same examples; a module's rows lie along the dimension
whose size is its forward's example count (dim 0 first). Where shapes differ beyond the batch (each rank pads its
own batch), the common extent is compared.

**The tolerance** is the check core's rule (mgpu/check/tolerance.py) per module: the spread is run B's distance
from run A on the same rows, the scale the largest element of world 1's rows, eps that of their dtype.

**The first difference** is the first event, in the order they happened, of a module's input (when it is called)
or output (when it returns) that is beyond its tolerance. Where every module agrees, the gradient at the output:
a common factor over every example, else one per rank, else one per forward (micro-batch) of each rank; and the
optimizer's gradients' common factor against world 1's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mgpu.check.tolerance import allowed_error, eps_of, error, largest
from mgpu.check.script.tensors import common_factor

__all__ = ["EntryFigures", "FirstDifference", "OutputGradient", "figures_of"]


@dataclass(frozen=True)
class FirstDifference:
    """The first module event beyond its tolerance: a module's input or its output."""

    event: str               # "input" | "output"
    module: str              # its label ('' for the model itself)
    module_type: str         # its class name
    caller: tuple | None     # (label, class name) of the module whose forward calls it; None: the code that calls the model
    has_children: bool       # it calls submodules
    error: float
    allowed: float
    rank: int | None


@dataclass(frozen=True)
class OutputGradient:
    """The gradient at the model's output against world 1's, per example: its error, and where it parts, the
    factor that tells how: over every example, else per rank, else per forward and rank (none where none holds)."""

    error: float
    allowed: float
    factor: float | None = None
    ranks: list | None = None
    rank_factors: list | None = None
    forward_factors: list | None = None


@dataclass(frozen=True)
class EntryFigures:
    """What the traced step shows, world N against world 1, before it is worded (causes/entry.entered)."""

    world: int
    kind: str                                # the divergence located: "gradient", "update", "weight"
    modules_compared: int
    truncated: bool                          # a rank's trace reached its TRACE_NUMEL
    gradient_factor: float | None            # the optimizer's gradients over world 1's (1.0: not a gradient's divergence)
    first: FirstDifference | None
    agree: tuple | None                      # (error, allowed, modules): the outputs' worst agreement, None: none compared
    output_gradient: OutputGradient | None   # None: not recorded


def figures_of(forwards: tuple, digests: tuple, runs: tuple, kind: str, truncated: bool) -> EntryFigures:
    """The figures of a traced step: `forwards` world 1's A and B (lists of traced forwards) and world N's per
    rank; `digests` their example digests (data.forward_digests: world 1's, world N's, run B's); `runs` world 1's
    run A and world N's (their optimizer's gradients at the traced step)."""
    a_fw, b_fw, n_fw = forwards
    da, dn, db = digests
    run_a, run_n = runs
    rows_a, order, types = _rows(a_fw, da)
    rows_b = _rows(b_fw, db)[0]
    rows_n = [_rows(fs, ds)[0] for fs, ds in zip(n_fw, dn)]
    judged = {}
    for key in order:
        j = _judged(rows_a[key], rows_b.get(key, []), [(r, rows.get(key, [])) for r, rows in enumerate(rows_n)])
        if j is not None:
            judged[key] = j
    first = next((_first(k, j, a_fw, types) for k, j in judged.items()
                  if k[2] != "grad" and not j["error"] <= j["allowed"]), None)
    agree = [j for k, j in judged.items() if k[2] == "output"]
    worst = max(agree, key=lambda j: j["error"] / j["allowed"] if j["allowed"] else 0.0, default=None)
    output_gradient = _output_gradient(judged.get((a_fw[0].root, "", "grad"))) if first is None else None
    # the optimizer's gradients at the step, world N's rank 0 against world 1's (1 where the update or the
    # weights diverged: the gradients agreed)
    step = run_a.ranks[0].trace.step
    recs_1, recs_n = run_a.ranks[0].steps, run_n.ranks[0].steps
    gradient_factor = (1.0 if kind != "gradient" else None if len(recs_1) < step or len(recs_n) < step else
                       common_factor(recs_n[step - 1].grads, recs_1[step - 1].grads))
    return EntryFigures(run_n.world, kind, len({k[:2] for k in judged if k[2] != "grad"}), truncated, gradient_factor,
                        first, (worst["error"], worst["allowed"], len(agree)) if agree else None, output_gradient)


# -- rows per example -------------------------------------------------------------------------------------

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


def _judged(ref: list, spread_rows: list, rows_n: list) -> dict | None:
    """One key's error against world 1 over every matched example, and its allowed error (the core's rule)."""
    pairs = _pairs(ref, rows_n)
    if not pairs:
        return None
    e, at = _distance(pairs)
    spread = _distance(_pairs(ref, [(None, spread_rows)]))[0] if spread_rows else 0.0
    scale = max(largest(r) for _, r, _ in ref)
    allowed = allowed_error(spread, scale, eps_of(ref[0][1]))
    return {"error": e, "allowed": allowed, "rank": pairs[at][2][0] if at >= 0 else None, "pairs": pairs}


# -- what the rows show ------------------------------------------------------------------------------------

def _first(key, judged: dict, a_fw: list, types: dict) -> FirstDifference:
    """The first difference, a module's input or output, with what its words need."""
    root, label, event = key
    parents = {k: v for f in a_fw for k, v in f.parents.items()}
    parent = parents.get(label)
    return FirstDifference(event, label, types.get(key[:2], root),
                           (parent, types.get((root, parent), root)) if parent is not None else None,
                           any(p == label for p in parents.values()), judged["error"], judged["allowed"], judged["rank"])


def _output_gradient(g: dict | None) -> OutputGradient | None:
    """The gradient at the model's output, where every module agrees: its error, and where it parts its factors,
    tried in turn (all examples together, per rank, per forward and rank)."""
    if g is None:
        return None
    if g["error"] <= g["allowed"]:
        return OutputGradient(g["error"], g["allowed"])
    pairs = g["pairs"]
    ranks = sorted({which for _, _, (which, _) in pairs})
    parts = sorted({which for _, _, which in pairs})
    ways = (("factor", [pairs]), ("rank_factors", [[p for p in pairs if p[2][0] == r] for r in ranks]),
            ("forward_factors", [[p for p in pairs if p[2] == part] for part in parts] if len(parts) > len(ranks) else []))
    for name, groups in ways:
        flat = [_flattened(group) for group in groups]
        factors = [None if f is None else common_factor({"g": f[1]}, {"g": f[0]}) for f in flat]
        if factors and None not in factors:
            found = {"factor": factors[0]} if name == "factor" else {name: factors}
            return OutputGradient(g["error"], g["allowed"], ranks=ranks if name == "rank_factors" else None, **found)
    return OutputGradient(g["error"], g["allowed"])


def _flattened(pairs: list) -> tuple | None:
    """World 1's rows and world N's, cropped and flattened together (float64); None where none crops."""
    cropped = [c for c in (_crop(ref, other) for ref, other, _ in pairs) if c is not None]
    if not cropped:
        return None
    return torch.cat([a.double().flatten() for a, _ in cropped]), torch.cat([b.double().flatten() for _, b in cropped])
