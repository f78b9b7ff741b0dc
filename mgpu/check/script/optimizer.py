"""The optimizer's side of a step, world N against world 1: its settings and its update.

    setting_divergence(step, got, ref, n, agreed)  # world N's settings against world 1's, exactly
    watch = UpdateWatch(n, facts, tally)
    watch.compare(StepWeights(...))              # the step's update against world 1's, within its tolerance

**Settings** are every key of each of the optimizer's `param_groups` but "params" (lr, weight_decay,
betas, momentum, eps, a scheduler's initial_lr...), tensors as floats, recorded as the optimizer will
use them (the pre-step hook runs after a scheduler has set the learning rate). They depend neither on
the data nor on rounding, and the same arithmetic computes them at every world size: world N's must
equal world 1's, floats within SETTING_ULPS float64 ulps. So a learning rate scaled by the world size is
named at the first step where the learning rates differ, however small the update it makes (a
warmup's first updates are below the weights' tolerance).

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
from mgpu.check.script.diagnose import ScriptFacts, schedule_cause, update_diagnosis
from mgpu.check.script.tally import Tally
from mgpu.check.script.tensors import POOL_RERUN, FACTOR_AGREE, allowances, common_factor, module_scales, name_factor

__all__ = ["same_setting", "setting_divergence", "ranks_settings_apart", "normalising",
           "updates_of", "StepWeights", "UpdateWatch", "steps_text", "SETTING_ULPS"]

# Settings are equal at every world size up to this many float64 ulps (the same float64 arithmetic).
SETTING_ULPS = 4
# Optimizers whose update divides by a running norm of the gradient: a rounding-level gradient gets
# an update of about lr * sign(g). Matched against the optimizer's class name, in lower case.
NORMALISING = ("adam", "rmsprop", "adagrad", "adadelta", "adafactor", "lion", "lamb", "sophia", "adabelief")
ABSENT = "(absent)"
# A scheduler's keys in param_groups besides initial_*: OneCycleLR's and CyclicLR's (schedule_key).
SCHEDULE_KEYS = ("max_lr", "min_lr", "base_lr", "max_momentum", "base_momentum")


# -- settings ----------------------------------------------------------------------------------------------

def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def same_setting(a, b) -> bool:
    """Equal, floats within SETTING_ULPS float64 ulps (NaN equals NaN), tuples element by element."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_setting(x, y) for x, y in zip(a, b))
    if _number(a) and _number(b):
        a, b = float(a), float(b)
        if a == b or (math.isnan(a) and math.isnan(b)):
            return True
        return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= SETTING_ULPS * math.ulp(max(abs(a), abs(b)))
    return a == b


def schedule_key(key: str) -> bool:
    """A scheduler's bookkeeping in a param group (initial_lr, OneCycleLR's max_lr...), not a setting
    the optimizer's step reads: the schedule's base, from which it sets the step's own (lr)."""
    return key.startswith("initial_") or key in SCHEDULE_KEYS


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
    sa, sb = (f"{a:.6g}" if _number(a) else str(a)), (f"{b:.6g}" if _number(b) else str(b))
    return (repr(a), repr(b)) if sa == sb else (sa, sb)


def _ratio(a, b) -> float | None:
    return float(a) / float(b) if _number(a) and _number(b) and b != 0 and math.isfinite(float(a) / float(b)) else None


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
                          diagnosis="the parameters are grouped otherwise at this world size")
    sa, sb = _shown(a, b)
    return ScriptDivergence(step, kind="setting", tensor=f"{key} of param group {group}", rank=0,
                      detail=f"world {n} {sa}, world 1 {sb}",
                      diagnosis=setting_diagnosis(key, (got[group], ref[group]), n, agreed, schedulers))


_SCALED = {"N": "a learning rate scaled by the world size (linear scaling rule)",
           "sqrt(N)": "a learning rate scaled by the square root of the world size (square-root scaling rule)",
           "1/N": "a learning rate divided by the world size", "1/sqrt(N)": "a learning rate divided by the square "
           "root of the world size"}
_KEEP = ("; the global batch is the same at every world size, so the learning rate must be too: scale it with the "
         "global batch, never with the number of ranks")
_PACE = ("the learning-rate schedule runs at another pace at this world size (its base learning rate agrees): a "
         "scheduler stepped once per process or per micro-batch (accelerate steps a prepared scheduler "
         "num_processes times per optimizer step unless step_scheduler_with_optimizer=False), or a schedule whose "
         "length is counted per rank")


def setting_diagnosis(key: str, groups: tuple[dict, dict], n: int, agreed: bool,
                      schedulers: tuple = ((), ())) -> str:
    """Why a setting differs: a learning rate scaled by a power of N (its base, a scheduler's initial_lr,
    too), a schedule at another pace or another schedule (its base agrees, or it agreed before: the
    schedulers recorded at the step tell which, diagnose.schedule_cause), another setting by N."""
    got, ref = groups
    a, b = got.get(key, ABSENT), ref.get(key, ABSENT)
    if ABSENT in (a, b):
        return (f"the optimizer is built with other options at this world size: {key} is set at world "
                f"{n if b == ABSENT else 1} only")
    c = _ratio(a, b)
    name = name_factor(c, n) if c is not None else None
    factor = "" if c is None else f"{c:.4g} x world 1's" + (f" = {name}" if name else "") + ": "
    if key in ("initial_lr", "max_lr", "min_lr", "base_lr"):
        return factor + f"the schedule's base learning rate ({key}): " + (
            _SCALED[name] + _KEEP if name else "set from the world size or the rank") + (
            "; the learning rate the step uses agrees until the schedule leaves zero (a warmup)")
    if key != "lr":
        what = "the schedule's" if schedule_key(key) else "optimizer setting"
        return factor + f"{what} {key} " + ("is set from the world size" if name else
                                            "depends on the world size (or the rank)")
    base = _ratio(got.get("initial_lr"), ref.get("initial_lr"))
    if base is not None and same_setting(got["initial_lr"], ref["initial_lr"]):
        return factor + (schedule_cause(*schedulers, n) or _PACE)
    if base is not None:
        base_name = name_factor(base, n)
        return factor + (_SCALED[base_name] if base_name else "a learning rate set from the world size or the "
                         "rank") + f" (its schedule's base, initial_lr, is {base:.4g} x world 1's)" + _KEEP + \
            _beyond_base(c, base, n, schedulers)
    if agreed:
        return factor + (schedule_cause(*schedulers, n) or _PACE)
    return factor + (_SCALED[name] + _KEEP if name else "the learning rate depends on the world size (or the rank)")


def _beyond_base(c: float | None, base: float, n: int, schedulers: tuple) -> str:
    """What of the learning rate's ratio to world 1's its base's ratio does not explain (lr 4 x world 1's
    over an initial_lr 2 x: a learning rate scaled by N and, besides, a warmup that accelerate's prepared
    scheduler steps N times an optimizer step): the schedule's own part, from the schedulers recorded at
    the step; '' where the base explains it all (the same float64 arithmetic: equal up to rounding)."""
    if c is None or math.isclose(c, base, rel_tol=1e-9):
        return ""
    return (f"; and beyond its base, the learning rate is {c / base:.4g} x more: " +
            (schedule_cause(*schedulers, n, base_agrees=False) or
             _PACE.replace(" (its base learning rate agrees)", "")))


def ranks_settings_apart(step: int, settings: list[list]) -> ScriptDivergence | None:
    """Every rank's settings against rank 0's, exactly: the ranks of one world step alike."""
    for r in range(1, len(settings)):
        apart = _first_apart(settings[r], settings[0])
        if apart is not None:
            group, key, a, b = apart
            sa, sb = _shown(a, b)
            return ScriptDivergence(step, kind="ranks", tensor=f"optimizer setting {key} of param group {group}", rank=r,
                              allowed=0.0, diagnosis=f"rank {r} uses {sa}, rank 0 {sb}: the optimizer is set by rank "
                              "(a setting or schedule computed from the rank, a scheduler stepped on some ranks only?)")
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
            self.drifts.append((sw.step, f"every update is {c:.3f} x world 1's, inside the tolerance", False))
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
            why = (f"{int((bad & rounding).sum())} of the {int(bad.sum())} element(s) that differ have a gradient at "
                   f"rounding level ({sw.optimizer_type} turns those into lr*sign(g): rounding, not a bug)")
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
        self.drifts.append((step, f"{self.optimizer_type}'s update of {name} took the other sign in {count} element(s) "
                                  "whose gradient is at rounding level (lr*sign(g) of rounding, not a bug)", True))

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
