"""The optimizer's side of a step, world N against world 1: its settings and its update.

    setting_divergence(step, got, ref, n, agreed)  # world N's settings against world 1's, exactly
    watch = UpdateWatch(n, facts, tally)
    watch.compare(StepWeights(...))              # the step's update against world 1's, within its tolerance

**Settings** are every key of each of the optimizer's `param_groups` but "params" (lr, weight_decay,
betas, momentum, eps, a scheduler's initial_lr...), tensors as floats, recorded as the optimizer will
use them (the pre-step hook runs after a scheduler has set the learning rate). They depend neither on
the data nor on rounding, and the same arithmetic computes them at every world size: world N's must
equal world 1's, floats within SETTING_ULPS float64 ulps (tensors.same_setting). So a learning rate
scaled by the world size is named at the first step where the learning rates differ, however small the
update it makes (a warmup's first updates are below the weights' tolerance); causes/optimizer.py says why.

**Updates**: u = after - before, per tensor, in float64 (exact: both are stored values). World N's
against world 1's with the core's rule (mgpu/check/tolerance.py): the spread is run B's update's
distance from run A's, and at least the weights' own rounding (eps times the largest weight of the
tensor's module: what after - before holds of rounding); the floor's scale is the largest update of
the tensor's module. An update whose allowed error is not below the update itself (about 16 ulps of
its weights or less) cannot be told from rounding: it is not compared, and the report says so.

**Adam's signs.** A normalising optimizer (Adam, AdamW, RMSprop, Adagrad, Lion...) turns a gradient
element at rounding level into an update of about lr * sign(g) (AdamW's first step exactly so). That
sign is rounding: world N's update there may be world 1's with the other sign while the gradients
agree within their tolerance. Where every element of a tensor's update that differs beyond the
tolerance has a gradient within the gradient's own allowed error of zero, the difference is rounding,
not a bug: no failure; the report notes it, and those elements (whose weights now differ by about
2 lr) are left out of the tensor's weight comparison from then on.

**Drifts** are what differs without failing: those signs, and updates that are c x world 1's with
c != 1 inside the tolerance (a common factor rounding cannot make). A divergence at a later step is
traced back to the first of them (compare.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from mgpu.check.script.divergence import ScriptDivergence
from mgpu.check.tolerance import allowed_error, eps_of, largest
from mgpu.check.script.causes.facts import ScriptFacts
from mgpu.check.script.causes.optimizer import (regrouped, rounding_signs, set_by_rank, setting_diagnosis, sign_drift,
                                                update_diagnosis, update_drift)
from mgpu.check.script.tally import Tally
from mgpu.check.script.tensors import (ABSENT, POOL_RERUN, FACTOR_AGREE, allowances, common_factor, module_scales,
                                       number, same_setting, schedule_key)

__all__ = ["same_setting", "setting_divergence", "ranks_settings_apart", "normalising",
           "updates_of", "StepWeights", "UpdateWatch", "steps_text"]

# Optimizers whose update divides by a running norm of the gradient: a rounding-level gradient gets
# an update of about lr * sign(g). Matched against the optimizer's class name, in lower case.
NORMALISING = ("adam", "rmsprop", "adagrad", "adadelta", "adafactor", "lion", "lamb", "sophia", "adabelief")


# -- settings ----------------------------------------------------------------------------------------------

def _first_apart(got: list, ref: list, schedule: bool = False) -> tuple | None:
    """(group, key, got's value, ref's value) of the first setting that differs, lr first, among the
    step's own settings (schedule=False) or the schedule's (schedule_key); None if all agree."""
    if len(got) != len(ref):
        return (None, "param_groups", len(got), len(ref)) if not schedule else None
    for g, (a, b) in enumerate(zip(got, ref)):
        keys = ["lr"] + [k for k in b if k != "lr"] + [k for k in a if k not in b and k != "lr"]
        for key in (k for k in keys if schedule_key(k) == schedule):
            x, y = a.get(key, ABSENT), b.get(key, ABSENT)
            if not same_setting(x, y):
                return g, key, x, y
    return None


def _shown(a, b) -> tuple[str, str]:
    """Two values as text, with as many digits as it takes to tell them apart."""
    sa, sb = (f"{a:.6g}" if number(a) else str(a)), (f"{b:.6g}" if number(b) else str(b))
    return (repr(a), repr(b)) if sa == sb else (sa, sb)


def setting_divergence(step: int, got: list, ref: list, n: int, agreed: bool,
                       schedule: bool = False, schedulers: tuple = ((), ())) -> ScriptDivergence | None:
    """World N's rank-0 settings at a step against world 1's: the first that differs, diagnosed.
    `agreed`: the learning rates agreed, and were not zero, at an earlier step. schedule=True: the
    schedule's keys only (schedule_key: a base learning rate that differs while the step's own
    learning rate does not yet, under a warmup from zero). `schedulers`: world N's and world 1's at the
    step (StepRecord.schedulers): what tells a schedule at another pace from another schedule."""
    apart = _first_apart(got, ref, schedule)
    if apart is None:
        return None
    group, key, a, b = apart
    if key == "param_groups":
        return ScriptDivergence(step, kind="setting", tensor="param_groups", rank=0,
                          detail=f"world {n} has {a} param group(s), world 1 {b}",
                          diagnosis=regrouped())
    sa, sb = _shown(a, b)
    return ScriptDivergence(step, kind="setting", tensor=f"{key} of param group {group}", rank=0,
                      detail=f"world {n} {sa}, world 1 {sb}",
                      diagnosis=setting_diagnosis(key, (got[group], ref[group]), n, agreed, schedulers))


def ranks_settings_apart(step: int, settings: list[list]) -> ScriptDivergence | None:
    """Every rank's settings against rank 0's, exactly: the ranks of one world step alike."""
    for r in range(1, len(settings)):
        apart = _first_apart(settings[r], settings[0])
        if apart is not None:
            group, key, a, b = apart
            return ScriptDivergence(step, kind="ranks", tensor=f"optimizer setting {key} of param group {group}", rank=r,
                              allowed=0.0, diagnosis=set_by_rank(r, _shown(a, b)))
    return None


# -- updates -----------------------------------------------------------------------------------------------

def normalising(optimizer_type: str) -> bool:
    """An optimizer that divides by a running norm of the gradient (Adam-like): see NORMALISING."""
    return any(word in optimizer_type.lower() for word in NORMALISING)


def updates_of(before: dict, after: dict) -> dict:
    """name -> after - before, for every weight held whole before and after the step: in float32 for
    float32 and lower weights (two float32 values this close subtract exactly), float64 for float64."""
    wide = lambda t: t if t.dtype == torch.float64 else t.float()  # noqa: E731
    return {k: wide(a) - wide(before[k]) for k, a in after.items()
            if isinstance(a, torch.Tensor) and isinstance(before.get(k), torch.Tensor) and a.shape == before[k].shape}


@dataclass(frozen=True)
class StepWeights:
    """One step's weights around the optimizer: (world N's rank 0, world 1's run A, run B) before and
    after it (B's None where B made fewer steps); world 1's gradients and their allowed errors."""

    step: int
    before: tuple
    after: tuple
    grads: dict                 # run A's gradients at the step
    grad_allowed: dict          # name -> the gradient's allowed error at the step
    optimizer_type: str
    pool: float = POOL_RERUN    # the spread's pooled quantile (tensors.allowances)


@dataclass
class UpdateWatch:
    """One world's updates against world 1's, step after step (the module docstring's rules)."""

    n: int
    facts: ScriptFacts
    tally: Tally
    excused: dict = field(default_factory=dict)   # name -> elements whose update was the sign of rounding (bool)
    flips: dict = field(default_factory=dict)     # name -> {step: elements}
    below: dict = field(default_factory=dict)     # name -> steps whose update is below the weights' rounding
    drifts: list = field(default_factory=list)    # (step, what drifted, whether it is rounding), in order
    compared_steps: list = field(default_factory=list)  # steps where some update was above rounding
    optimizer_type: str = ""

    def compare(self, sw: StepWeights) -> ScriptDivergence | None:
        """World N's updates at a step against world 1's; the first beyond its tolerance, diagnosed."""
        self.optimizer_type = sw.optimizer_type
        got, ref, spread = (updates_of(b, a) if a is not None and b is not None else {}
                            for b, a in zip(sw.before, sw.after))
        weights, scales = module_scales(sw.after[1]), module_scales(ref)
        floors = {}  # the weights' own rounding, as an allowed error: 16 x eps x the module's largest weight
        for name, u in ref.items():
            if name in got and got[name].shape == u.shape:  # else the weights' comparison names it
                eps = eps_of(sw.after[1][name])  # the weights' dtype: float64 differences of float32 (bf16) values
                floors[name] = allowed_error(eps * weights[name], scales[name], eps)
        above = {k: ref[k] for k, f in floors.items() if f < scales[k]}
        pooled = allowances(above, {k: spread[k] for k in above if k in spread} or None, sw.pool)
        allowed = {}
        for name, floor in floors.items():
            a = max(floor, pooled.get(name, math.inf))
            if a < scales[name]:
                allowed[name] = a
            else:
                self.below.setdefault(name, []).append(sw.step)
        if allowed:
            self.compared_steps.append(sw.step)
        compared = ({k: got[k] for k in allowed}, {k: ref[k] for k in allowed})
        for name, a in allowed.items():
            d = self._tensor(sw, name, a, compared)
            if d is not None:
                return d
        c = common_factor(*compared) if allowed else None
        if c is not None and abs(c - 1) > FACTOR_AGREE:
            self.drifts.append((sw.step, update_drift(c), False))
        return None

    def _tensor(self, sw: StepWeights, name: str, allowed: float, compared: tuple) -> ScriptDivergence | None:
        got, ref = compared[0][name], compared[1][name]
        diff = (got - ref).abs().nan_to_num(nan=math.inf)
        error, top = (float(diff.max()) if diff.numel() else 0.0), largest(ref)
        bad = diff > allowed
        rounding = self._rounding_level(sw, name)
        if error > allowed and rounding is not None and not bool((bad & ~rounding).any()):
            self._excuse(sw.step, name, bad)
            rest = diff[~bad]
            error = float(rest.max()) if rest.numel() else 0.0
        self.tally.add("update", name, sw.step, error, allowed, top)
        if error <= allowed:
            return None
        why = ""
        if rounding is not None and bool((bad & rounding).any()):
            why = rounding_signs(int((bad & rounding).sum()), int(bad.sum()), sw.optimizer_type)
        return ScriptDivergence(sw.step, kind="update", tensor=name, rank=0, max_abs=error, allowed=allowed,
                          max_rel=error / top if top > 0 else math.inf,
                          diagnosis=update_diagnosis(compared[0], compared[1], self.n, self.facts, why))

    @staticmethod
    def _rounding_level(sw: StepWeights, name: str):
        """The elements whose gradient is within its allowed error of zero, for a normalising optimizer
        (where rounding picks the update's sign); None for any other optimizer."""
        g, allowed = sw.grads.get(name), sw.grad_allowed.get(name)
        if not normalising(sw.optimizer_type) or not isinstance(g, torch.Tensor) or allowed is None:
            return None
        return g.double().abs() <= allowed

    def _excuse(self, step: int, name: str, bad: torch.Tensor) -> None:
        mask = self.excused.get(name)
        self.excused[name] = bad if mask is None else (mask | bad)
        count = int(bad.sum())
        self.flips.setdefault(name, {})[step] = count
        self.drifts.append((step, sign_drift(self.optimizer_type, name, count), True))

    def masked(self, name: str, got, ref):
        """World N's weight with the elements excused so far (Adam's signs of rounding) set to world 1's."""
        mask = self.excused.get(name)
        if mask is None or not isinstance(got, torch.Tensor) or not isinstance(ref, torch.Tensor) \
                or got.shape != mask.shape or ref.shape != mask.shape:
            return got
        return torch.where(mask, ref.to(got.dtype), got)

    def notes(self) -> list[str]:
        """What the comparison's notes say of the updates: the signs of rounding, where any."""
        if not self.flips:
            return []
        total = sum(sum(s.values()) for s in self.flips.values())
        where = "; ".join(f"{name}: " + ", ".join(f"{k} at step {s}" for s, k in steps.items())
                          for name, steps in list(self.flips.items())[:4])
        more = f" and {len(self.flips) - 4} more tensor(s)" if len(self.flips) > 4 else ""
        return [f"{self.optimizer_type}'s update took the other sign at world {self.n} than at world 1 in {total} "
                f"element(s) whose gradient is at rounding level ({where}{more}): AdamW's first step turns "
                "rounding-sized gradients into lr*sign(g), and later steps do where the gradient stays at "
                "rounding level; this is rounding, not a bug. Those elements' weights (about 2 lr apart) are left "
                "out of the weights' comparison from then on"]

    def not_compared(self) -> list[str]:
        """The updates too small to compare, and why."""
        if not self.below:
            return []
        shown = "; ".join(f"{name} at {steps_text(steps)}" for name, steps in list(self.below.items())[:4])
        more = f" and {len(self.below) - 4} more" if len(self.below) > 4 else ""
        return [f"updates against world 1 of {len(self.below)} tensor(s) ({shown}{more}): not above the weights' "
                "own rounding (an update within about 16 ulps of its module's largest weight cannot be told from "
                "rounding); the optimizer settings were compared exactly"]


def steps_text(steps: list) -> str:
    """[0, 1, 2, 4] -> 'before step 1, steps 1-2, 4'."""
    steps = sorted(set(steps))
    parts, head = [], "before step 1" if steps and steps[0] == 0 else ""
    steps = [s for s in steps if s > 0]
    for s in steps:
        if parts and parts[-1][1] == s - 1:
            parts[-1][1] = s
        else:
            parts.append([s, s])
    runs = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)
    body = ("step " if len(steps) == 1 else "steps ") + runs if steps else ""
    return ", ".join(p for p in (head, body) if p)
