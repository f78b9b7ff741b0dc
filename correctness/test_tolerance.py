"""What `mgpu check`'s tolerance promises (mgpu/check/tolerance.py; docs/design/check-tolerance.md): a
data-parallel run may be FACTOR (16) times further from the float64 step than the single-device
float32 step is (the spread), and no further. Correct runs came within 5.27 spreads, a real defect is
off by orders of magnitude more; a defect of SPREADS spreads lies between, 3 times past what the rule
allows and within what a rule 10 times looser would, so the rule must catch it.

The defect is planted in the manual strategy (in process, two emulated devices): its allreduced
gradient of one tensor scaled by (1 + delta), on every replica alike (on one replica only the
bitwise `replicas` check would catch it, whatever the tolerance). delta is sized from the spread the
check itself measured in an honest run of the same model.

    pytest correctness/test_tolerance.py
"""

from __future__ import annotations

import torch
from torch import nn

from correctness.helpers import COMPARISON_KIND
from mgpu.check.tolerance import FLOOR_ULPS, error, largest
from mgpu.config import CheckOptions
from mgpu.check.model import judge
from mgpu.parity import run_check
from mgpu.check.model.compare import EPS32
from mgpu.spec import image_spec
from mgpu.strategies import Manual

# The planted error, in spreads of its tensor: beyond the 16 the tolerance allows, with a margin of 3
# over it and of 3 under a tolerance 10 times looser (160).
SPREADS = 50.0


class RawPixels(nn.Module):
    """An MLP fed raw pixel values (0 to 255, not normalised) into tanh, which they mostly saturate:
    the gradient through a saturated tanh is 1 - tanh^2, which float32 rounds far above its size, so
    the measured spread, not the floor's 4 ulps, sizes the first layer's allowances."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 16), nn.Linear(16, 4)

    def forward(self, x):  # (B, 1, 8, 8) in [0, 1) -> (B, 4)
        return self.fc2(torch.tanh(self.fc1(255.0 * x.flatten(1))))


def _check(spec, monkeypatch, planted: tuple[str, float] | None = None):
    """run_check of manual on 2 devices, one step; with `planted` (name, delta) the allreduced gradient
    of that parameter is (1 + delta) times what it should be, on every replica."""
    if planted is not None:
        name, delta = planted
        sync = Manual.sync_gradients

        def scaled(self, global_batch_size):
            sync(self, global_batch_size)
            with torch.no_grad():
                for replica in self.replicas:
                    dict(replica.named_parameters())[name].grad.mul_(1 + delta)
        monkeypatch.setattr(Manual, "sync_gradients", scaled)
    options = CheckOptions(strategies=("manual",), devices=(2,), steps=1, step_timeout=30, device=COMPARISON_KIND)
    report = run_check(spec, options)
    return {r.name: r for r in report.results if r.strategy == "manual"}


def _measured_spreads(spec, monkeypatch) -> dict:
    """name -> (spread, largest |float64 gradient|) of the first step's gradients, as the check measured
    them in an honest run (its comparison's own inputs), which must pass."""
    seen = {}
    compare = judge.compare_to_reference

    def spy(actual, reference, single, step, replica, prefix="", against="the single-device float64 run"):
        if prefix == "gradient " and step == 1 and not seen:
            seen.update({name: (error(single[name], r)[0], largest(r)) for name, r in reference.items()
                         if r is not None})
        return compare(actual, reference, single, step, replica, prefix, against)
    with monkeypatch.context() as m:
        m.setattr(judge, "compare_to_reference", spy)
        honest = _check(spec, monkeypatch)
    assert honest["gradients"].status == "pass", f"the honest run fails: {honest['gradients']}"
    assert seen, "the check compared no first-step gradients"
    return seen


def test_a_gradient_off_by_50_spreads_fails_the_check(monkeypatch):
    spec = image_spec(RawPixels, (1, 8, 8), 4, name="raw_pixels")
    spreads = _measured_spreads(spec, monkeypatch)
    # the tensor whose spread is furthest above the floor: its allowance is 16 spreads, the floor none of it
    name = max(spreads, key=lambda k: spreads[k][0] / spreads[k][1])
    spread, scale = spreads[name]
    floor = FLOOR_ULPS * EPS32 * scale
    assert spread >= 4 * floor, f"{name}: the spread {spread:.2e} is not far above the floor {floor:.2e}: {spreads}"
    delta = SPREADS * spread / scale
    results = _check(spec, monkeypatch, planted=(name, delta))
    what = (f"manual's allreduced gradient of {name} x (1 + {delta:.2e}): {SPREADS:g} times the spread "
            f"{spread:.2e} the check measured (the float32 step's distance from float64)")
    gradients = results["gradients"]
    d = gradients.first_divergence
    assert gradients.status == "fail" and d is not None, (
        f"{what} passed the gradients check ({gradients.errors}): the tolerance allows more than 16 spreads")
    assert (d.tensor, d.step) == (f"gradient {name}", 1), f"{what}: {d.describe()}"
    assert 0.8 * SPREADS <= d.max_abs / spread <= 1.2 * SPREADS and d.allowed < d.max_abs / 3, (
        f"{what}: error {d.max_abs:.2e} ({d.max_abs / spread:.1f} spreads), allowed {d.allowed:.2e}")


def test_bitwise_equality_is_bits_with_nan_equal_to_nan_and_nothing_else():
    """The core's one bitwise equality (mgpu.check.tolerance.bitwise_equal), which replicas of a run and a
    run and its rerun must hold: a NaN equals a NaN, never a number; inf is no finite maximum; another
    dtype or shape is another tensor."""
    from mgpu.check.tolerance import bitwise_equal

    nan, inf, big = float("nan"), float("inf"), torch.finfo(torch.float32).max
    cases = [  # (a, b, equal, why)
        ([nan, 1.0], [nan, 1.0], True, "NaN where both hold one"),
        ([nan, 1.0], [0.0, 1.0], False, "NaN against 0"),
        ([0.0, 1.0], [nan, 1.0], False, "0 against NaN"),
        ([inf], [big], False, "inf against float32's largest"),
        ([-0.0], [0.0], True, "signed zeros compare equal, as torch.equal has them"),
        ([1.0, 2.0], [1.0, 2.0 + 2 ** -22], False, "one ulp"),
    ]
    for a, b, equal, why in cases:
        assert bitwise_equal(torch.tensor(a), torch.tensor(b)) is equal, f"{why}: {a} vs {b}"
    assert not bitwise_equal(torch.ones(2), torch.ones(2, dtype=torch.float64)), "another dtype"
    assert not bitwise_equal(torch.ones(2), torch.ones(1, 2)), "another shape"
    assert bitwise_equal(torch.arange(3), torch.arange(3)) and not bitwise_equal(torch.arange(3), torch.arange(1, 4))
