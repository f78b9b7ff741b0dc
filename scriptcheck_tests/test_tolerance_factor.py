"""What check-script's tolerance promises (the check core's rule, mgpu/check/tolerance.py): world N's
tensor may be FACTOR (16) times further from world 1's than world 1's rerun B is (the spread), and no
further. A difference of 5 spreads is rounding's; one of 50, 3 times past the rule and within what a
rule 10 times looser would allow, is a defect, and the comparison must fail it.

    pytest scriptcheck_tests/test_tolerance_factor.py

Records made here (float32, one SGD step), compared as the judge does (compare.compare_world), in
this process: every tensor's rerun spread is SPREAD of its largest element, far above the floor's
4 float32 ulps, so the spread alone sizes the allowance.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mgpu.check.script.inrank.records import RankRecord, StepRecord
from mgpu.check.script.compare import compare_world
from mgpu.check.script.causes.facts import ScriptFacts

LR = 0.1
SPREAD = 1e-5   # run B's distance from run A, relative to each gradient's largest element (float32's eps: 1.2e-7)
DEFECT = "layer2.weight"


def _run(world: int, before: dict, grads: dict):
    """A float32 run's records: one SGD step from `before` with `grads`, every rank alike."""
    after = {name: before[name] - LR * g for name, g in grads.items()}
    step = StepRecord(0, 1, "SGD", [], dict(grads), after=after, before=dict(before),
                      settings=[{"lr": LR, "momentum": 0.0, "weight_decay": 0.0}])
    return SimpleNamespace(world=world, lifted=False, ranks=[RankRecord(steps=[step], world=world)
                                                             for _ in range(world)])


def _compared(spreads: float):
    """World 2 against world 1 (A, and B at SPREAD), world 2's DEFECT gradient off by `spreads` spreads."""
    gen = torch.Generator().manual_seed(5)
    names = [f"layer{i}.weight" for i in range(5)]
    before = {name: torch.randn(4, 8, generator=gen) for name in names}
    a = {name: 0.1 * torch.randn(4, 8, generator=gen) for name in names}
    b = {name: g + SPREAD * float(g.abs().max()) * (torch.randint(0, 2, g.shape, generator=gen) * 2 - 1)
         for name, g in a.items()}
    n = dict(a)
    n[DEFECT] = a[DEFECT] * (1 + spreads * SPREAD)
    spread = float((b[DEFECT] - a[DEFECT]).abs().max())
    return compare_world(_run(2, before, n), _run(1, before, a), _run(1, before, b), ScriptFacts(), ""), spread


def test_a_gradient_off_by_50_spreads_fails_and_by_5_passes():
    c, spread = _compared(50)
    d = c.first
    assert c.status == "fail" and d is not None, (
        f"world 2's {DEFECT} gradient 50 spreads ({spread:.2e} each) from world 1's passed: the tolerance allows "
        f"more than 16 spreads (worst: {c.worst})")
    assert (d.kind, d.step, d.tensor) == ("gradient", 1, DEFECT), d.describe()
    assert 45 <= d.max_abs / spread <= 55 and d.allowed < d.max_abs / 3, (
        f"error {d.max_abs:.2e} ({d.max_abs / spread:.1f} spreads), allowed {d.allowed:.2e}")
    rounding, _ = _compared(5)
    assert rounding.status == "pass", (
        f"world 2's {DEFECT} gradient 5 spreads from world 1's failed: the tolerance allows less than 16 spreads: "
        f"{rounding.first and rounding.first.describe()}")
