"""check-script widens its tolerance for mixed precision only: where world N as run (bf16 autocast,
say) is compared with world 1 as run, the spread is world 1 lifted to float32, and each tensor's
spread is pooled at the largest of its step's (tensors.POOL_PRECISION: AdamW turns rounding-level
gradients into lr * sign(g) wherever that rounding flips them). A float32 comparison, as run or
lifted, pools its perturbed rerun's spread at the median (POOL_RERUN): a defect the float32 rule
catches must stay caught, however much one tensor's honest spread exceeds the others'.

    pytest scriptcheck_tests/test_precision_pooling.py

Records made here, compared as the judge does (compare.compare_world), in this process.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mgpu.check.script.inrank.records import RankRecord, StepRecord
from mgpu.check.script.compare import compare_world
from mgpu.check.script.causes.facts import ScriptFacts
from mgpu.check.script.launch import WorldRun, liftable
from mgpu.check.script.tensors import POOL_PRECISION, POOL_RERUN, allowances

LR = 0.1
PERTURB = 2.0 ** -22   # run B's perturbation of a float32 gradient: two float32 roundings (launch.PERTURB)
WIDE = 1e-3            # the honest relative spread of one tensor: far above the others' (a gradient that nearly cancels)
LAYERS = 7             # layer0..layer5 with float32-sized spreads, `wide` with WIDE: the median is a float32 one
DEFECT = "layer0.weight"


def _world_1():
    """World 1's gradients (run A), its rerun B's (each element moved by PERTURB * (|g| + rms(g)), one
    tensor by WIDE instead) and the weights before the step."""
    gen = torch.Generator().manual_seed(3)
    names = [f"layer{i}.weight" for i in range(LAYERS - 1)] + ["wide.weight"]
    before = {name: torch.randn(4, 8, generator=gen) for name in names}
    a = {name: 0.1 * torch.randn(4, 8, generator=gen) for name in names}
    b = {}
    for name, g in a.items():
        sign = torch.randint(0, 2, g.shape, generator=gen) * 2 - 1
        size = WIDE * float(g.abs().max()) if name == "wide.weight" else PERTURB * (g.abs() + g.pow(2).mean().sqrt())
        b[name] = g + size * sign
    return before, a, b


def _run(world: int, before: dict, grads: dict, lifted: bool = False):
    """A run's records: one SGD step (no momentum) from `before` with `grads`, every rank alike."""
    after = {name: before[name] - LR * g for name, g in grads.items()}
    step = StepRecord(0, 1, "SGD", [], dict(grads), after=after, before=dict(before),
                      settings=[{"lr": LR, "momentum": 0.0, "weight_decay": 0.0}])
    return SimpleNamespace(world=world, lifted=lifted, ranks=[RankRecord(steps=[step], world=world)
                                                              for _ in range(world)])


def _defect_between_the_two_rules():
    """World 2's gradients: world 1's, with DEFECT's scaled by (1 + delta), delta sized so that its error
    is the geometric mean of DEFECT's allowance under the two pools, each at least 10 x away."""
    before, a, b = _world_1()
    float32_rule = allowances(a, b, POOL_RERUN)[DEFECT]
    mixed_rule = allowances(a, b, POOL_PRECISION)[DEFECT]
    error = (float32_rule * mixed_rule) ** 0.5
    assert 10 * float32_rule <= error <= mixed_rule / 10, (
        f"the plant does not lie between the rules: float32 allows {float32_rule:.2e}, mixed precision "
        f"{mixed_rule:.2e}, the defect is {error:.2e}")
    delta = error / float(a[DEFECT].abs().max())
    n = dict(a)
    n[DEFECT] = a[DEFECT] * (1 + delta)
    return before, a, b, n, delta, float32_rule, mixed_rule


def test_a_float32_comparison_pools_at_the_median_and_catches_a_defect_the_mixed_precision_rule_would_pass():
    before, a, b, n, delta, float32_rule, mixed_rule = _defect_between_the_two_rules()
    what = (f"{DEFECT}'s gradient x (1 + {delta:.1e}) on world 2: float32's rule allows {float32_rule:.2e}, "
            f"mixed precision's {mixed_rule:.2e}")
    cases = {"float32 as run (A and its perturbed rerun B)": (False, False),
             "float32, mixed precision lifted (A and B lifted)": (True, True)}
    for case, (a_lifted, b_lifted) in cases.items():
        c = compare_world(_run(2, before, n, a_lifted), _run(1, before, a, a_lifted), _run(1, before, b, b_lifted),
                          ScriptFacts(), "")
        d = c.first
        assert c.status == "fail" and d is not None, (
            f"{case}: {what}; the comparison passed (status {c.status}): a float32 run got the mixed-precision "
            f"pool (the largest spread of the step, not the median)")
        assert (d.kind, d.step, d.tensor) == ("gradient", 1, DEFECT), f"{case}: {what}; {d.describe()}"
        assert d.allowed < 2 * float32_rule and d.max_abs > d.allowed, (
            f"{case}: {what}; allowed {d.allowed:.2e} for an error of {d.max_abs:.2e}")
    # The control: world N as run in a mixed precision, against world 1 as run, its spread world 1 lifted
    # (A as run, B lifted): the same difference is within the precision's own rounding.
    c = compare_world(_run(2, before, n), _run(1, before, a), _run(1, before, b, lifted=True), ScriptFacts(), "")
    assert c.status == "pass" and c.first is None, (
        f"mixed precision as run: {what}; it failed, so this test cannot tell the two rules apart: "
        f"{c.first and c.first.describe()}")


def test_only_a_run_that_computed_below_float32_is_lifted():
    def run_at(lowest: str) -> WorldRun:
        return WorldRun(1, "A", "cpu", [], ranks=[RankRecord(precision={"lowest": lowest})])

    assert not liftable(run_at("float32")), "a float32 run would get the mixed-precision plan (its spread: A lifted)"
    assert liftable(run_at("bfloat16")) and liftable(run_at("float16"))
