"""The arithmetic of check-script's comparison: the error and bitwise equality of two recorded
values (a tensor, a Digest, or None), the tolerance of one tensor (the check core's rule,
mgpu/check/tolerance.py, with run B's spread), the common factor between two sets of tensors, and the
equality and ratio of two optimizer settings (optimizer.py compares them, causes/optimizer.py words them).
"""

from __future__ import annotations

import math

from mgpu.check.tolerance import allowed_error, bitwise_equal, eps_of, error, largest
from mgpu.check.script.inrank.inputs import Digest, tensor_digest

__all__ = ["err", "same", "module_scales", "allowance", "allowances", "POOL_RERUN", "POOL_PRECISION", "common_factor", "name_factor", "FACTOR_AGREE", "RESIDUAL",
           "same_setting", "setting_ratio", "schedule_key", "SETTING_ULPS", "SCHEDULE_KEYS", "ABSENT"]

# A common factor is named when every tensor's least-squares ratio is within this of it, and each
# tensor is that multiple of world 1's to within RESIDUAL (relative).
FACTOR_AGREE = 0.005
RESIDUAL = 0.01



def err(a, b) -> tuple[float, float]:
    """The core's error of two recorded values; a Digest or a missing value is infinitely far (0 when both are missing)."""
    if a is None or b is None:
        return (0.0, 0.0) if a is None and b is None else (math.inf, math.inf)
    if isinstance(a, Digest) or isinstance(b, Digest):
        return math.inf, math.inf
    return error(a, b)


def same(a, b) -> bool:
    """Bitwise equality of two recorded values (a tensor, a Digest, or None)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, Digest) or isinstance(b, Digest):
        da = a.hex if isinstance(a, Digest) else tensor_digest(a)
        db = b.hex if isinstance(b, Digest) else tensor_digest(b)
        return da == db
    return bitwise_equal(a, b)


def module_scales(tensors: dict, big: dict | None = None) -> dict:
    """name -> the largest magnitude among the tensors of its module ('fc1.weight' and 'fc1.bias'):
    the floor's scale. A bias before a BatchNorm has an exact gradient of zero: what it holds is the
    rounding of terms as large as its weight's gradient, so its own magnitude is no measure. `big`:
    name -> largest(tensor), where the caller has them already."""
    by_module: dict = {}
    for name, t in tensors.items():
        key = name.rsplit(".", 1)[0] if "." in name else name
        by_module[key] = max(by_module.get(key, 0.0), big[name] if big is not None else largest(t))
    return {name: by_module[name.rsplit(".", 1)[0] if "." in name else name] for name in tensors}


def allowance(a, b_run, scale: float = 0.0) -> float:
    """The core's rule for world 1's tensor `a`: the spread is run B's distance from it, the floor's
    scale the largest of `a` and its module (module_scales); 0 (bitwise) for a digest or integers."""
    if a is None or isinstance(a, Digest) or not a.is_floating_point() or a.numel() == 0:
        return 0.0
    spread = err(b_run, a)[0] if b_run is not None and not isinstance(b_run, Digest) else 0.0
    return allowed_error(spread, max(largest(a), scale), eps_of(a))


# A tensor's spread is at least this quantile of the relative spreads of its step's tensors of one kind
# (each relative to its own scale), times its scale: the median where the spread is a perturbed rerun,
# the largest where it is the mixed precision's own rounding (world 1 lifted: allowances).
POOL_RERUN = 0.5
POOL_PRECISION = 1.0


def allowances(reference: dict, spread_run: dict | None, pool: float = POOL_RERUN) -> dict:
    """name -> the allowed error of each of world 1's tensors (the core's rule, mgpu/check/tolerance.py).

    Each tensor's spread is its distance from the spread run's, but at least the `pool` quantile of
    every tensor's relative spread (spread / scale) times its own scale. A perturbed rerun moves each
    tensor by a random draw, and one it happened to move little would get a tolerance below what
    another summation order does to it (a BatchNorm weight's gradient, a sum over 10^5 terms): pooled
    at the median, no tensor's tolerance rests on its own draw alone, and the verdict of a correct
    script does not change from run to run. Where the spread is the mixed precision's own rounding
    (world 1 as run against world 1 in float32), AdamW's first step turns a gradient at rounding level
    into lr * sign(g) in whichever tensors the rounding happens to flip: pooled at the largest."""
    big = {name: largest(a) for name, a in reference.items()}
    scales = module_scales(reference, big)
    out, relative, spreads = {}, [], {}
    for name, a in reference.items():
        if a is None or isinstance(a, Digest) or not a.is_floating_point() or a.numel() == 0:
            out[name] = 0.0
            continue
        b = spread_run.get(name) if spread_run else None
        spread = err(b, a)[0] if b is not None and not isinstance(b, Digest) else 0.0
        scale = max(big[name], scales[name])
        spreads[name] = (spread if math.isfinite(spread) else 0.0, scale)
        if scale > 0 and math.isfinite(spread):
            relative.append(spread / scale)
    pooled = sorted(relative)[min(len(relative) - 1, int(pool * len(relative)))] if relative else 0.0
    for name, (spread, scale) in spreads.items():
        out[name] = allowed_error(max(spread, pooled * scale), scale, eps_of(reference[name]))
    return out


def common_factor(actual: dict, reference: dict) -> float | None:
    """The one factor c with actual ~= c * reference for every tensor (least squares per tensor, all
    agreeing within FACTOR_AGREE, residuals within RESIDUAL); None when there is none."""
    ratios = []
    for name, ref in reference.items():
        got = actual.get(name)
        if ref is None or got is None or isinstance(got, Digest) or isinstance(ref, Digest) or got.shape != ref.shape:
            continue
        r, g = ref.double().flatten(), got.double().flatten()
        rr = float(r @ r)
        if rr == 0 or not math.isfinite(rr):
            continue
        c = float(g @ r) / rr
        res = float((g - c * r).norm()) / max(float(g.norm()), 1e-300)
        if not math.isfinite(c) or res > RESIDUAL:
            return None
        ratios.append(c)
    if not ratios:
        return None
    mid = sorted(ratios)[len(ratios) // 2]
    if mid == 0 or any(abs(c - mid) > FACTOR_AGREE * abs(mid) for c in ratios):
        return None
    return mid


def name_factor(c: float, n: int) -> str | None:
    for value, name in ((1 / n, "1/N"), (1 / math.sqrt(n), "1/sqrt(N)"), (n, "N"), (math.sqrt(n), "sqrt(N)")):
        if abs(c - value) <= FACTOR_AGREE * value:
            return name
    return None


# -- optimizer settings ------------------------------------------------------------------------------------

# Settings are equal at every world size up to this many float64 ulps (the same float64 arithmetic).
SETTING_ULPS = 4
# A setting one param group holds and the other does not, as shown.
ABSENT = "(absent)"
# A scheduler's keys in param_groups besides initial_*: OneCycleLR's and CyclicLR's (schedule_key).
SCHEDULE_KEYS = ("max_lr", "min_lr", "base_lr", "max_momentum", "base_momentum")


def number(v) -> bool:
    """A setting that is a number (int or float), not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def same_setting(a, b) -> bool:
    """Equal, floats within SETTING_ULPS float64 ulps (NaN equals NaN), tuples element by element."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_setting(x, y) for x, y in zip(a, b))
    if number(a) and number(b):
        a, b = float(a), float(b)
        if a == b or (math.isnan(a) and math.isnan(b)):
            return True
        return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= SETTING_ULPS * math.ulp(max(abs(a), abs(b)))
    return a == b


def schedule_key(key: str) -> bool:
    """A scheduler's bookkeeping in a param group (initial_lr, OneCycleLR's max_lr...), not a setting
    the optimizer's step reads: the schedule's base, from which it sets the step's own (lr)."""
    return key.startswith("initial_") or key in SCHEDULE_KEYS


def setting_ratio(a, b) -> float | None:
    """a / b for two numbers whose ratio is finite; None otherwise."""
    return float(a) / float(b) if number(a) and number(b) and b != 0 and math.isfinite(float(a) / float(b)) else None
