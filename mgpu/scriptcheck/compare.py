"""World N against world 1, optimizer step by optimizer step, and why they part.

For each step, in this order, the first thing that differs is the divergence:

1. before step 1: every rank's weights against rank 0's (bitwise: "replicas start apart"), then
   world N's rank 0 against world 1;
2. the data: the examples every root-model forward of the step consumed, over all ranks, against
   world 1's (per-example digests; padding stripped, the batch dimension found from the shapes);
3. the gradients the optimizer saw: every rank against rank 0 (bitwise: synchronised?), then rank 0
   against world 1, within the tolerance;
4. the weights after the step: the same two comparisons.

**The tolerance** is the check core's rule (mgpu/check/tolerance.py; docs/guide/check-script.md),
with check-script's spread: world 1 runs twice, A, and B, whose every gradient the optimizer uses
is moved by `PERTURB * (|g| + rms(g))` per element with random signs (launch.PERTURB = 2^-22, two
float32 roundings): a difference of the size that another summation order makes, which is what
averaging shards over ranks changes. B's distance from A, tensor by tensor and step by step, is how
far this computation carries such a difference. The floor's scale is the largest element of the
tensor's module; it covers step 1's gradients, which B cannot perturb before they are computed.
Bitwise between ranks of one world: they apply the same gradients.

A world-1 rerun that differs where no perturbation reached (the data, the weights before step 1,
step 1's gradients) means the script has randomness of its own: nothing can be compared, the
report is NOT VERIFIED, and says where the two runs first differ.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from mgpu.check.divergence import Divergence
from mgpu.check.records import StepRecord
from mgpu.check.tolerance import largest
from mgpu.scriptcheck.data import StepData, data_divergence, step_data
from mgpu.scriptcheck.diagnose import ScriptFacts, explained, gradient_diagnosis, uninitialised_cause, update_diagnosis
from mgpu.scriptcheck.tally import Tally
from mgpu.scriptcheck.tensors import (POOL_PRECISION, POOL_RERUN, allowance, allowances, common_factor, err,
                                      module_scales, same)


__all__ = ["ScriptFacts", "WorldComparison", "compare_world", "reproducibility", "common_factor", "module_scales"]

@dataclass
class WorldComparison:
    world: int
    status: str                # "pass", "fail", "finding", "not-compared"
    steps: int                 # steps compared
    first: Divergence | None = None
    tally: Tally = field(default_factory=Tally)  # per kind: the worst tensor, the sensitivity, how much was compared
    notes: list = field(default_factory=list)
    reason: str = ""
    precision: str = ""        # the arithmetic compared: '' (float32 as run), 'float32, autocast(cpu, bfloat16) lifted', ...
    entered: dict | None = None  # where a gradient or weight divergence enters the model (locate.py), else None

    @property
    def worst(self) -> dict:
        return self.tally.worst

    def to_json(self) -> dict:
        return {"world": self.world, "status": self.status, "steps_compared": self.steps,
                "first_divergence": self.first.to_json() if self.first else None, **self.tally.to_json(),
                "notes": self.notes, "reason": self.reason,
                "precision": self.precision or "float32", "entered": self.entered}


# -- comparison ----------------------------------------------------------------------------------------

def _records(run) -> list[list[StepRecord]]:
    return [r.steps for r in run.ranks]


def reproducibility(a, b) -> Divergence | None:
    """Where world 1's rerun B first differs from run A where no perturbation reached: the weights
    each model held when first called (digests taken before B's perturbation), the data of any step.
    Weights that held non-finite or huge values then are uninitialised memory, not a missing seed."""
    ia, ib = a.ranks[0].init_digests, b.ranks[0].init_digests
    for name, d in ia.items():
        if ib.get(name) != d:
            return Divergence(0, kind="start", tensor=name, allowed=0.0,
                              diagnosis=uninitialised_cause([a.ranks[0], b.ranks[0]]) or "two world-1 runs start "
                              "from other weights: the model's initialisation is not seeded")
    ra, rb = a.ranks[0].steps, b.ranks[0].steps
    for i, (x, y) in enumerate(zip(ra, rb)):
        sd = step_data(x, [y], 1)
        if collections.Counter(sd.world_1) != collections.Counter(sd.ranks[0]):
            return Divergence(i + 1, kind="data",
                              diagnosis="two world-1 runs took other examples: the data order (or an augmentation) is not "
                              "seeded", detail=f"inputs of {_root_name(x)}")
    return None


def _root_name(rec: StepRecord) -> str:
    names = {f.root_name for f in rec.forwards}
    return ", ".join(sorted(n for n in names if n)) or "the model"


def _ranks_apart(rn: list[StepRecord], n: int, key: str, step: int) -> Divergence | None:
    """Every rank's gradients ("grads") or weights after the step ("after") against rank 0's, bitwise:
    the ranks of one world apply the same update."""
    what = "gradient" if key == "grads" else "weight"
    for r in range(1, n):
        for name, t in getattr(rn[0], key).items():
            if not same(getattr(rn[r], key).get(name), t):
                e = err(getattr(rn[r], key).get(name), t)
                why = (f"rank {r}'s gradient differs from rank 0's as the optimizer steps: the gradients are not "
                       "synchronised (no DDP, or an all_reduce missing for this parameter)" if key == "grads" else
                       f"rank {r}'s weights part from rank 0's in this step although their gradients agree: the "
                       "optimizer differs between ranks (a setting by rank, a step skipped on one rank?)")
                return Divergence(step, kind="ranks", tensor=f"{what} {name}", rank=r,
                                  max_abs=e[0] if math.isfinite(e[0]) else None, allowed=0.0, diagnosis=why)
    return None


def _start_apart(rn: list[StepRecord], r1: StepRecord, n: int) -> Divergence | None:
    """Before step 1: the replicas against rank 0 (bitwise), then world N's rank 0 against world 1."""
    for r in range(1, n):
        for name, t in (rn[0].before or {}).items():
            if not same((rn[r].before or {}).get(name), t):
                e = err((rn[r].before or {}).get(name), t)
                return Divergence(0, kind="ranks", tensor=name, rank=r, max_abs=e[0] if math.isfinite(e[0]) else None,
                                  allowed=0.0, diagnosis="replicas start apart: broadcast rank 0's weights before training (DDP does at "
                                  "construction; a hand-made loop must dist.broadcast every parameter), or "
                                  "build the model from the same seed on every rank")
    scales = module_scales(r1.before or {})
    for name, t in (r1.before or {}).items():
        got = (rn[0].before or {}).get(name, "missing")
        if isinstance(got, str):
            return Divergence(0, kind="start", tensor=name, rank=0,
                              diagnosis=f"world {n} has no parameter {name} in its optimizer")
        e = err(got, t)
        allowed = allowance(t, None, scales[name])
        if not e[0] <= allowed:
            return Divergence(0, kind="start", tensor=name, rank=0, max_abs=e[0], allowed=allowed, max_rel=e[1],
                              diagnosis=f"world {n} starts from other weights than world 1: the model is built from "
                              "another random state at this world size; seed before building it, with "
                              "the same seed at every world size (not seed + rank), or load the same checkpoint")
    return None


def _gradients_apart(step: int, rn: list[StepRecord], refs: tuple, n: int, sd: StepData, facts: ScriptFacts,
                     tally: Tally) -> Divergence | None:
    """World N's rank 0 gradients against world 1's (refs: run A's step, run B's or None, and the
    spread's pool), within the tolerance (run B's spread, tensors.allowances)."""
    r1, rb, pool = refs
    allowed_of = allowances(r1.grads, rb.grads if rb else None, pool)
    for name, g1 in r1.grads.items():
        gn = rn[0].grads.get(name, "missing")
        if isinstance(gn, str):
            return Divergence(step, kind="gradient", tensor=name, rank=0,
                              diagnosis=f"world {n}'s optimizer has no parameter {name}")
        if (g1 is None) != (gn is None):
            return Divergence(step, kind="gradient", tensor=name, rank=0,
                              diagnosis=f"world {'1' if g1 is None else str(n)} has no gradient for it: a parameter "
                                        "unused at one world size")
        if g1 is None:
            continue
        e = err(gn, g1)
        allowed = allowed_of[name]
        tally.add("gradient", name, step, e[0], allowed, largest(g1))
        if not e[0] <= allowed:
            return Divergence(step, kind="gradient", tensor=name, rank=0, max_abs=e[0], allowed=allowed, max_rel=e[1],
                              diagnosis=gradient_diagnosis(rn[0].grads, r1.grads, n, sd, facts))
    return None


def _weights_apart(i: int, recs_n: list, refs: tuple, n: int, facts: ScriptFacts, tally: Tally) -> Divergence | None:
    """World N's rank 0 weights after step i + 1 against world 1's (refs: run A's steps, run B's
    step i or None, the spread's pool), within the tolerance (tensors.allowances)."""
    ref, rb, pool = refs
    step, rn0, r1 = i + 1, recs_n[0][i], ref[i]
    allowed_of = allowances(r1.after, rb.after if rb else None, pool)
    for name, w1 in r1.after.items():
        e = err(rn0.after.get(name), w1)
        allowed = allowed_of[name]
        tally.add("weight", name, step, e[0], allowed, largest(w1))
        if not e[0] <= allowed:
            before_n = rn0.before if i == 0 else recs_n[0][i - 1].after
            before_1 = r1.before if i == 0 else ref[i - 1].after
            return Divergence(step, kind="weight", tensor=name, rank=0, max_abs=e[0], allowed=allowed, max_rel=e[1],
                              diagnosis=update_diagnosis((before_n, rn0.after), (before_1, r1.after), n, facts))
    return None


def compare_world(run_n, run_a, run_b, facts: ScriptFacts, batch_hint: str) -> WorldComparison:
    """World N (all ranks) against world 1 (run A, tolerance from run B), step by step: the start, the
    data, the gradients (between ranks, then against world 1), the weights after the step (the same)."""
    n = run_n.world
    recs_n = _records(run_n)
    ref, per = run_a.ranks[0].steps, run_b.ranks[0].steps
    steps = min([len(ref)] + [len(r) for r in recs_n])
    out = WorldComparison(n, "pass", steps)
    if len(recs_n[0]) != len(ref):
        out.notes.append(f"world {n} made {len(recs_n[0])} optimizer step(s) and world 1 {len(ref)}: compared on "
                         f"the first {steps}")
    tally = out.tally
    pool = POOL_PRECISION if getattr(run_b, "lifted", False) and not getattr(run_a, "lifted", False) else POOL_RERUN
    previous_1 = None
    for i in range(steps):
        step = i + 1
        r1, rb = ref[i], per[i] if i < len(per) else None
        rn = [recs[i] for recs in recs_n]
        d = None
        if (rn[0].optimizer, rn[0].step) != (r1.optimizer, r1.step):
            d = Divergence(step, kind="data", diagnosis="the optimizers step in another order at this world size",
                           detail=f"world {n} stepped optimizer {rn[0].optimizer}, world 1 optimizer {r1.optimizer}")
        if d is None and i == 0:
            d = _start_apart(rn, r1, n)
        if d is None:
            sd = step_data(r1, rn, n)
            d = data_divergence(step, sd, n, _root_name(r1), batch_hint, previous_1)
            previous_1 = len(sd.world_1)
            d = (d or _ranks_apart(rn, n, "grads", step) or _gradients_apart(step, rn, (r1, rb, pool), n, sd, facts, tally)
                 or _ranks_apart(rn, n, "after", step) or _weights_apart(i, recs_n, (ref, rb, pool), n, facts, tally))
        if d is not None:
            out.first = d
            known = explained(facts)
            finding = known and d.kind in ("gradient", "weight") and d.diagnosis == known
            out.status = "finding" if finding else "fail"
            return out
    return out
