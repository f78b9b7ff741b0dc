"""World N against world 1, optimizer step by optimizer step, and why they part.

For each step, in this order, the first thing that differs is the divergence:

1. before step 1: every rank's weights against rank 0's (bitwise: "replicas start apart"), then
   world N's rank 0 against world 1;
2. the data: the examples every root-model forward of the step consumed, over all ranks, against
   world 1's (per-example digests; padding stripped, the batch dimension found from the shapes);
3. the optimizer's settings (param_groups: lr, weight decay, betas...): every rank against rank 0,
   then rank 0 against world 1, exactly (optimizer.py);
4. the gradients the optimizer saw: every rank against rank 0 (bitwise: synchronised?), then rank 0
   against world 1, within the tolerance;
5. the weights after the step, every rank against rank 0 (bitwise: equal updates); the update
   (after - before) against world 1's, within its tolerance, where it is above the weights' own
   rounding (optimizer.py); the weights after the step against world 1's.

**Everything that can be compared is compared.** The checks run in four groups: the ranks against
rank 0, the data, the settings against world 1, and the trajectory against world 1 (the start, the
gradients, the updates, the weights). A group stops at its first failure (what follows from it is
no news) and the others go on, every step: after the data differ, the ranks are still checked
against each other and the settings against world 1's; only a failure of the ranks, the data or
the settings also stops the trajectory's comparison with world 1, which then compares other
computations. The comparison lists what it compared and what not, and why; the first failure is
the divergence, the others are reported with it (`later`). A divergence of the trajectory is traced
back to the first step where something drifted without failing (optimizer.py's drifts).

**The tolerance** is the check core's rule (mgpu/check/tolerance.py; docs/guide/check-script.md),
with check-script's spread: world 1 runs twice, A, and B, whose parameters (when first called), leaf
modules' output gradients (in the backward) and every gradient the optimizer uses are moved by
`PERTURB * (|g| + rms(g))` per element with random signs (launch.PERTURB = 2^-22, two float32
roundings; inrank/spread.py): a difference of the size that another summation order makes, which is
what averaging shards over ranks changes. What rounding carries further than B shows (a kink crossed)
the confirm stage tells from the loop in float64 (confirm.py). B's distance from A, tensor by tensor and step by step, is how
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
from dataclasses import dataclass, field, replace

from mgpu.check.script.divergence import ScriptDivergence
from mgpu.check.script.inrank.records import StepRecord
from mgpu.check.tolerance import largest
from mgpu.check.script.causes.data import another_order, unseeded_data
from mgpu.check.script.causes.facts import ScriptFacts
from mgpu.check.script.causes.gradients import (gradient_diagnosis, missing_in_optimizer, ranks_apart, traced,
                                                unused_parameter)
from mgpu.check.script.causes.optimizer import schedule_drift, schedule_unreached, update_diagnosis
from mgpu.check.script.causes.randomness import NOT_KEYED, explained
from mgpu.check.script.causes.start import missing_at_start, other_start, replicas_apart, unseeded_start
from mgpu.check.script.data import StepData, data_divergence, step_data
from mgpu.check.script.optimizer import StepWeights, UpdateWatch, ranks_settings_apart, setting_divergence, steps_text, \
    updates_of
from mgpu.check.script.epochs import per_epoch
from mgpu.check.script.tally import Tally
from mgpu.check.script.tensors import (POOL_PRECISION, POOL_RERUN, allowance, allowances, common_factor, err,
                                      module_scales, same)


__all__ = ["ScriptFacts", "WorldComparison", "compare_world", "reproducibility", "common_factor", "module_scales"]

@dataclass
class WorldComparison:
    world: int
    status: str                # "pass", "fail", "finding", "not-compared"
    steps: int                 # steps compared
    first: ScriptDivergence | None = None
    tally: Tally = field(default_factory=Tally)  # per kind: the worst tensor, the sensitivity, how much was compared
    notes: list = field(default_factory=list)
    reason: str = ""
    precision: str = ""        # the arithmetic compared: '' (float32 as run), 'float32, autocast(cpu, bfloat16) lifted', ...
    entered: dict | None = None  # where a gradient or weight divergence enters the model (locate.py), else None
    later: list = field(default_factory=list)         # failures after the first, of the other checks (ScriptDivergence)
    compared: list = field(default_factory=list)      # "gradients against world 1 (steps 1-4)", ...
    not_compared: list = field(default_factory=list)  # what was not compared, and why
    epochs: list = field(default_factory=list)        # --whole-run: per epoch, its steps, what was compared and not

    @property
    def worst(self) -> dict:
        return self.tally.worst

    def to_json(self) -> dict:
        return {"world": self.world, "status": self.status, "steps_compared": self.steps,
                "first_divergence": self.first.to_json() if self.first else None, **self.tally.to_json(),
                "notes": self.notes, "reason": self.reason,
                "precision": self.precision or "float32", "entered": self.entered,
                "later_divergences": [d.to_json() for d in self.later], "compared": self.compared,
                "not_compared": self.not_compared, **({"epochs": self.epochs} if self.epochs else {})}


# -- comparison ----------------------------------------------------------------------------------------

def _records(run) -> list[list[StepRecord]]:
    return [r.steps for r in run.ranks]


def reproducibility(a, b) -> ScriptDivergence | None:
    """Where world 1's rerun B first differs from run A where no perturbation reached: the weights
    each model held when first called (digests taken before B's perturbation), the data of any step.
    Weights that held non-finite or huge values then are uninitialised memory, not a missing seed."""
    ia, ib = a.ranks[0].init_digests, b.ranks[0].init_digests
    for name, d in ia.items():
        if ib.get(name) != d:
            return ScriptDivergence(0, kind="start", tensor=name, allowed=0.0,
                              diagnosis=unseeded_start([a.ranks[0], b.ranks[0]]))
    ra, rb = a.ranks[0].steps, b.ranks[0].steps
    for i, (x, y) in enumerate(zip(ra, rb)):
        sd = step_data(x, [y], 1)
        if collections.Counter(sd.world_1) != collections.Counter(sd.ranks[0]):
            return ScriptDivergence(i + 1, kind="data",
                              diagnosis=unseeded_data(), detail=f"inputs of {_root_name(x)}")
    return None


def _root_name(rec: StepRecord) -> str:
    names = {f.root_name for f in rec.forwards}
    return ", ".join(sorted(n for n in names if n)) or "the model"


def _ranks_apart(rn: list[StepRecord], n: int, key: str, step: int) -> ScriptDivergence | None:
    """Every rank's gradients ("grads") or weights after the step ("after") against rank 0's, bitwise:
    the ranks of one world apply the same update."""
    what = "gradient" if key == "grads" else "weight"
    for r in range(1, n):
        for name, t in getattr(rn[0], key).items():
            if not same(getattr(rn[r], key).get(name), t):
                e = err(getattr(rn[r], key).get(name), t)
                return ScriptDivergence(step, kind="ranks", tensor=f"{what} {name}", rank=r,
                                  max_abs=e[0] if math.isfinite(e[0]) else None, allowed=0.0,
                                  diagnosis=ranks_apart(key, r))
    return None


def _replicas_apart(rn: list[StepRecord], n: int) -> ScriptDivergence | None:
    """Before step 1: the replicas against rank 0, bitwise."""
    for r in range(1, n):
        for name, t in (rn[0].before or {}).items():
            if not same((rn[r].before or {}).get(name), t):
                e = err((rn[r].before or {}).get(name), t)
                return ScriptDivergence(0, kind="ranks", tensor=name, rank=r, max_abs=e[0] if math.isfinite(e[0]) else None,
                                  allowed=0.0, diagnosis=replicas_apart())
    return None


def _start_apart(rn: list[StepRecord], r1: StepRecord, n: int) -> ScriptDivergence | None:
    """Before step 1: world N's rank 0 against world 1."""
    scales = module_scales(r1.before or {})
    for name, t in (r1.before or {}).items():
        got = (rn[0].before or {}).get(name, "missing")
        if isinstance(got, str):
            return ScriptDivergence(0, kind="start", tensor=name, rank=0,
                              diagnosis=missing_at_start(n, name))
        e = err(got, t)
        allowed = allowance(t, None, scales[name])
        if not e[0] <= allowed:
            return ScriptDivergence(0, kind="start", tensor=name, rank=0, max_abs=e[0], allowed=allowed, max_rel=e[1],
                              diagnosis=other_start(got, n))
    return None



def _gradients_apart(step: int, rn: list[StepRecord], refs: tuple, n: int, sd: StepData, facts: ScriptFacts,
                     tally: Tally, allowed_of: dict) -> ScriptDivergence | None:
    """World N's rank 0 gradients against world 1's (refs: run A's step, run B's or None, and the
    spread's pool), within the tolerance (run B's spread, tensors.allowances, filled into allowed_of)."""
    r1, rb, pool = refs
    allowed_of.update(allowances(r1.grads, rb.grads if rb else None, pool))
    for name, g1 in r1.grads.items():
        gn = rn[0].grads.get(name, "missing")
        if isinstance(gn, str):
            return ScriptDivergence(step, kind="gradient", tensor=name, rank=0,
                              diagnosis=missing_in_optimizer(n, name))
        if (g1 is None) != (gn is None):
            return ScriptDivergence(step, kind="gradient", tensor=name, rank=0,
                              diagnosis=unused_parameter('1' if g1 is None else str(n)))
        if g1 is None:
            continue
        e = err(gn, g1)
        allowed = allowed_of[name]
        tally.add("gradient", name, step, e[0], allowed, largest(g1))
        if not e[0] <= allowed:
            return ScriptDivergence(step, kind="gradient", tensor=name, rank=0, max_abs=e[0], allowed=allowed, max_rel=e[1],
                              diagnosis=gradient_diagnosis(rn[0].grads, r1.grads, n, sd, facts))
    return None


def _weights_apart(i: int, recs_n: list, refs: tuple, watch: UpdateWatch) -> ScriptDivergence | None:
    """World N's rank 0 weights after step i + 1 against world 1's (refs: run A's steps, run B's
    step i or None, the spread's pool), within the tolerance (tensors.allowances); elements whose
    update was a normalising optimizer's sign of rounding are left out (watch.masked)."""
    ref, rb, pool = refs
    step, rn0, r1 = i + 1, recs_n[0][i], ref[i]
    allowed_of = allowances(r1.after, rb.after if rb else None, pool)
    for name, w1 in r1.after.items():
        e = err(watch.masked(name, rn0.after.get(name), w1), w1)
        allowed = allowed_of[name]
        watch.tally.add("weight", name, step, e[0], allowed, largest(w1))
        if not e[0] <= allowed:
            before_n = rn0.before if i == 0 else recs_n[0][i - 1].after
            before_1 = r1.before if i == 0 else ref[i - 1].after
            why = update_diagnosis(updates_of(before_n or {}, rn0.after), updates_of(before_1 or {}, r1.after),
                                   watch.n, watch.facts)
            return ScriptDivergence(step, kind="weight", tensor=name, rank=0, max_abs=e[0], allowed=allowed, max_rel=e[1],
                              diagnosis=why)
    return None


def compare_world(run_n, run_a, run_b, facts: ScriptFacts, batch_hint: str) -> WorldComparison:
    """World N (all ranks) against world 1 (run A, tolerance from run B), step by step: every check
    that can still say something (the module docstring): the start, the data, the optimizer's
    settings, the gradients, the updates and the weights, between ranks and against world 1."""
    n = run_n.world
    recs_n = _records(run_n)
    ref, per = run_a.ranks[0].steps, run_b.ranks[0].steps
    steps = min([len(ref)] + [len(r) for r in recs_n])
    out = WorldComparison(n, "pass", steps)
    if len(recs_n[0]) != len(ref):
        out.notes.append(f"world {n} made {len(recs_n[0])} optimizer step(s) and world 1 {len(ref)}: compared on "
                         f"the first {steps}")
    apart = next((i for i in range(steps) if ref[i].epoch != recs_n[0][i].epoch), None)
    if apart is not None:  # --whole-run: an epoch of other length at world N (its data ran out first, or the script's)
        out.notes.append(f"from step {apart + 1} world {n} is in epoch {recs_n[0][apart].epoch} and world 1 in epoch "
                         f"{ref[apart].epoch} (an epoch made other numbers of steps: its data ran out before "
                         f"--epoch-steps at one world size? a smaller --epoch-steps keeps them alike): compared on the "
                         f"first {apart} step(s)")
        out.steps = steps = apart
    pool = POOL_PRECISION if getattr(run_b, "lifted", False) and not getattr(run_a, "lifted", False) else POOL_RERUN
    walk = _Walk(out, UpdateWatch(n, facts, out.tally), pool, batch_hint)
    for i in range(steps):
        _step(walk, i, recs_n, (ref, per))
    walk.close()
    if any(r.epoch is not None for r in ref):
        out.epochs = per_epoch(walk.seen, ref[:steps], walk.stopped)
    light = [i + 1 for i, r in enumerate(ref[:steps]) if r.light]
    if light:  # --whole-run past its memory bound (inrank/recorder.py): data and settings only
        out.not_compared.append(f"gradients, updates and weights of {steps_text(light)}: not kept (--whole-run's memory "
                                "bound; their data and settings compared)")
    return out


def _step(w: "_Walk", i: int, recs_n: list, world_1: tuple) -> None:
    """Step i + 1's checks, in the module docstring's order, each while its group runs (_Walk)."""
    ref, per = world_1
    n, step, facts, tally = w.out.world, i + 1, w.watch.facts, w.out.tally
    r1, rb = ref[i], per[i] if i < len(per) else None
    rn = [recs[i] for recs in recs_n]
    if "data" not in w.stopped and (rn[0].optimizer, rn[0].step) != (r1.optimizer, r1.step):
        w.fail("data", ScriptDivergence(step, kind="data", diagnosis=another_order(),
                                        detail=f"world {n} stepped optimizer {rn[0].optimizer}, world 1 optimizer "
                                        f"{r1.optimizer}"))
        why = f"from step {step}: the optimizers step in another order than world 1's"
        w.stop("data", f"the data against world 1 {why}")
        w.stop("settings", f"optimizer settings against world 1 {why}")
    if i == 0:
        w.check("ranks", "replicas across ranks", 0, lambda: _replicas_apart(rn, n))
        w.check("world1", "weights against world 1", 0, lambda: _start_apart(rn, r1, n))
    sd = step_data(r1, rn, n) if "data" not in w.stopped else None
    if sd is not None:
        w.check("data", "the data against world 1", step,
                lambda: data_divergence(step, sd, n, _root_name(r1), w.hint, w.previous_1, facts.randomness))
        w.previous_1 = len(sd.world_1)
    w.check("ranks", "optimizer settings across ranks", step,
            lambda: ranks_settings_apart(step, [r.settings for r in rn]))
    w.check("settings", "optimizer settings against world 1", step, lambda: w.settings(step, rn[0], r1))
    w.check("ranks", "gradients across ranks (synchronised)", step, lambda: _ranks_apart(rn, n, "grads", step))
    allowed_g: dict = {}
    w.check("world1", "gradients against world 1", step,
            lambda: _gradients_apart(step, rn, (r1, rb, w.pool), n, sd, facts, tally, allowed_g))
    w.check("ranks", "weights after the step across ranks (equal updates)", step,
            lambda: _ranks_apart(rn, n, "after", step))
    w.check("world1", "", step, lambda: w.watch.compare(_around(i, recs_n, world_1, allowed_g, w.pool)))
    if w.watch.compared_steps[-1:] == [step]:
        w.seen.setdefault("updates against world 1", []).append(step)
    w.check("world1", "weights after the step against world 1", step,
            lambda: _weights_apart(i, recs_n, (ref, rb, w.pool), w.watch))


def _around(i: int, recs_n: list, world_1: tuple, allowed_g: dict, pool: float) -> StepWeights:
    """Step i + 1's weights before and after, world N's rank 0 and world 1's A and B (optimizer.py)."""
    ref, per = world_1

    def before(recs):
        return (recs[0].before or {}) if i == 0 else recs[i - 1].after
    b = i < len(per)
    return StepWeights(i + 1, (before(recs_n[0]), before(ref), before(per) if b else None),
                       (recs_n[0][i].after, ref[i].after, per[i].after if b else None), ref[i].grads, allowed_g,
                       ref[i].optimizer_type, pool)


@dataclass
class _Walk:
    """One world's comparison under way: the groups of checks still running ("ranks", "data",
    "settings", "world1": the trajectory against world 1), the steps each check compared, where and
    why each group stopped."""

    out: WorldComparison
    watch: UpdateWatch
    pool: float
    hint: str
    stopped: dict = field(default_factory=dict)     # group -> why it stopped (the report's "not compared")
    seen: dict = field(default_factory=dict)        # check -> the steps it compared
    data_apart: list = field(default_factory=list)  # the steps whose data differ from world 1's
    previous_1: int | None = None                   # world 1's examples in the step before
    lr_agreed: bool = False                         # the learning rates agreed, not zero, at a step
    schedule: ScriptDivergence | None = None              # the first step where a schedule's base differed

    def check(self, group: str, label: str, step: int, compare) -> None:
        if group in self.stopped:
            return
        d = compare()
        if label:
            self.seen.setdefault(label, []).append(step)
        if d is not None:
            self.fail(group, d)

    def settings(self, step: int, rn0: StepRecord, r1: StepRecord) -> ScriptDivergence | None:
        """The step's own settings decide; a schedule's base that differs first (initial_lr, under a
        warmup from zero) is named with them, or fails by itself at the end if they never differ."""
        d = setting_divergence(step, rn0.settings, r1.settings, self.out.world, self.lr_agreed,
                               schedulers=(rn0.schedulers, r1.schedulers))
        self.lr_agreed = self.lr_agreed or (d is None and any(g.get("lr") for g in r1.settings))
        if self.schedule is None:
            self.schedule = setting_divergence(step, rn0.settings, r1.settings, self.out.world, False, schedule=True)
        if d is not None and self.schedule is not None and self.schedule.step < step:
            d = replace(d, diagnosis=schedule_drift(d.diagnosis, self.schedule.step, self.schedule.tensor,
                                                    self.schedule.detail))
        return d

    def stop(self, group: str, why: str) -> None:
        self.stopped.setdefault(group, why)

    def fail(self, group: str, d: ScriptDivergence) -> None:
        """A failure: the first is the divergence, the others `later`; the group stops (the data go on,
        counted), and a failure of the ranks, the data or the settings stops the trajectory's."""
        n, where = self.out.world, ("the start" if d.step == 0 else f"step {d.step}")
        if group == "data":
            self.data_apart.append(d.step)
            if len(self.data_apart) > 1:
                return
        if self.out.first is None:
            self.out.first = d
        else:
            self.out.later.append(d)
        own = {"ranks": f"ranks against rank 0 after {where}: rank {d.rank} parted from rank 0 there",
               "settings": f"optimizer settings against world 1 after {where}: they differ there",
               "world1": f"gradients, updates and weights against world 1 after {where}: world {n} parted from "
                         f"world 1 there ({d.kind})"}
        if group in own:
            self.stop(group, own[group])
        because = {"ranks": f"world {n}'s ranks do not hold one model", "settings": "the optimizer settings differ "
                   "from world 1's", "data": f"the data differ from world 1's (world {n} computed on other examples)"}
        if group in because:
            self.stop("world1", f"gradients, updates and weights against world 1 from {where}: {because[group]}")

    def close(self) -> None:
        """What was compared and what not; the notes; the status; the divergence traced back to a drift."""
        out, facts = self.out, self.watch.facts
        if self.schedule is not None and "settings" not in self.stopped:  # the step's own settings never differed
            d = replace(self.schedule, diagnosis=schedule_unreached(self.schedule.diagnosis))
            out.first, later = (d, [out.first]) if out.first is None or out.first.step > d.step else (out.first, [d])
            out.later[:0] = [x for x in later if x is not None]
        out.compared = [f"{label} ({steps_text(steps)})" for label, steps in self.seen.items()]
        out.not_compared = list(self.stopped.values()) + self.watch.not_compared()
        if len(self.data_apart) > 1:
            out.notes.append(f"the data differ from world 1's at {steps_text(self.data_apart)}")
        out.notes.extend(self.watch.notes())
        if out.first is None:
            return
        known = explained(facts)
        finding = (bool(known) and out.first.kind in ("gradient", "update", "weight") and out.first.diagnosis == known) \
            or (out.first.kind == "data" and NOT_KEYED in out.first.diagnosis)  # randomness not keyable (causes/randomness.py)
        if finding and out.later:  # a known reason came first, a failure of another check after it
            out.notes.append(f"{out.first.where()}, world {out.world} differs for a known reason: "
                             f"{known or out.first.diagnosis}")
            out.first, finding = out.later.pop(0), False
        out.status = "finding" if finding else "fail"
        out.first = _traced(out.first, self.watch.drifts)


def _traced(d: ScriptDivergence, drifts: list) -> ScriptDivergence:
    """A divergence of the trajectory, named at the first step before it where something drifted: a
    drift that is no rounding (a common factor) is where it starts; the signs of rounding (Adam's) moved
    some weights since, which may be what parts here, or not: said beside this step's own cause
    (causes/gradients.traced)."""
    first = next((x for x in drifts if x[0] < d.step), None)
    if first is None or d.kind not in ("gradient", "update", "weight"):
        return d
    return replace(d, diagnosis=traced(d.diagnosis, d.kind, d.step, first))
