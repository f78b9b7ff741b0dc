"""check-script's float64 confirmation and run B's noise in the backward: a divergence of the trajectory
that no factor of the world size explains is computed again in float64, where float32's rounding is gone
and a loop's bug is not (docs/guide/check-script.md, "Confirmed in float64"; mgpu/check/script/confirm.py).

    pytest scriptcheck_tests/test_confirm_float64.py
"""

from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mgpu.check.script.inrank.float64 import Float64Lift, promote
from mgpu.check.script.inrank.spread import noise_output_gradients, rounding_noise
from mgpu.scriptcheck import run_check_script
from scriptcheck_tests.test_check_sensitivity import SCALED_LOSS
from scriptcheck_tests.shared import WORLD_SIZE_FACTOR, shared_report

LOOPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "loops")

# test_check_sensitivity's correct DDP loop, and in it a stand-in for float32's rounding carried far: at
# world N each float32 gradient moves by DELTA of its largest element before the optimizer sees it (a
# difference that float32 makes at another summation order, and float64 does not). A float64 gradient is
# left alone.
_SCALED = "        (loss * (1 + delta) if world > 1 else loss).backward()\n"
assert _SCALED in SCALED_LOSS, "test_check_sensitivity's loop changed: plant the float32-only difference anew"
FLOAT32_ONLY = SCALED_LOSS.replace(_SCALED, """        loss.backward()
        for p in model.parameters():
            if world > 1 and p.grad.dtype == torch.float32:
                p.grad.add_(delta * p.grad.abs().max())
""")


# -- the float64 lift, in a rank ------------------------------------------------------------------------------

def test_an_op_mixing_float32_with_float64_gets_its_float32_tensors_in_float64():
    x32, w64 = torch.randn(4, 3), torch.randn(2, 3, dtype=torch.float64)
    args, kwargs = promote(F.linear, (x32, w64), {})
    assert [a.dtype for a in args] == [torch.float64, torch.float64], "linear(float32 input, float64 weight) not lifted"
    torch.testing.assert_close(args[0], x32.double(), rtol=0, atol=0, msg="the lift changed the input's values")
    pair, _ = promote(torch.cat, ([x32, w64],), {})
    assert [t.dtype for t in pair[0]] == [torch.float64, torch.float64], "a list argument's float32 tensor not lifted"


def test_ops_on_float32_alone_and_what_an_in_place_op_writes_into_stay_as_they_are():
    a, b = torch.randn(3), torch.randn(3)
    args, _ = promote(torch.add, (a, b), {})
    assert args[0] is a and args[1] is b, "an op on float32 alone was changed"
    target, other = torch.zeros(3), torch.ones(3, dtype=torch.float64)
    args, kwargs = promote(torch.Tensor.add_, (target, other), {})
    assert args[0] is target, "an in-place op's own tensor was replaced: it would write into a copy"
    args, kwargs = promote(torch.add, (other, other), {"out": target})
    assert kwargs["out"] is target, "out= was replaced"


def test_under_the_lift_a_model_is_built_and_computes_in_float64():
    with Float64Lift():
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    assert torch.get_default_dtype() == torch.float32, "the lift left torch's default dtype at float64"
    assert {p.dtype for p in model.parameters()} == {torch.float64}, "a model built under the lift is not float64"


def test_run_bs_output_gradient_noise_is_rounding_sized_and_reaches_the_module_through_an_inplace_op():
    x = torch.randn(64, 16, dtype=torch.float64, requires_grad=True)  # float64: the bound below is not rounded
    y = x * 3.0
    before = y.detach().clone()
    noise_output_gradients(y, 2.0 ** -22, seed=5)
    torch.testing.assert_close(y, before, rtol=0, atol=0, msg="run B's noise changed a forward value")
    out = torch.relu_(y)  # the script changes the module's output in place after it returned
    grad = torch.randn(64, 16, dtype=torch.float64)
    (got,) = torch.autograd.grad(out, x, grad)
    passed = (before > 0).double() * grad   # the gradient at the module's output, before the noise
    moved = (got - 3.0 * passed).abs()
    bound = 3.0 * 2.0 ** -22 * (passed.abs() + passed.pow(2).mean().sqrt()) * 1.001
    assert bool((moved <= bound).all()) and float(moved.max()) > 0, (
        f"the output gradient moved by {float(moved.max()):.2e}, not by rounding size (at most {float(bound.max()):.2e})")
    again = rounding_noise(grad, 2.0 ** -22, seed=5)
    torch.testing.assert_close(again, rounding_noise(grad, 2.0 ** -22, seed=5), rtol=0, atol=0,
                               msg="run B's noise is not the same draw for the same seed")
    wide = rounding_noise(grad, 2.0 ** -22, seed=5, own_units=True)
    assert float(wide.abs().max()) < 1e-14 * float(grad.abs().max() + 1), "float64's own units are not float64's size"


# -- the confirmation, end to end -------------------------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_difference_only_float32_makes_passes_confirmed_in_float64_and_a_float64_one_fails(tmp_path):
    path = tmp_path / "float32_only.py"
    path.write_text(textwrap.dedent(FLOAT32_ONLY))
    report = run_check_script(str(path), ["1e-3"], ranks=(1, 2), steps=3)
    text = report.text()
    assert str(report.verdict) == "passed", f"a difference float64 takes away failed the check:\n{text}"
    assert "confirmed in float64" in text and "at float32 world 2 parted from world 1 at step 1" in text, text
    assert report.timings.get("confirm", 0) > 0, f"no confirmation time reported: {report.timings}"
    (comparison,) = report.comparisons
    assert comparison.tally.sensitivity["gradient"]["relative"] < 1e-10, (
        f"the float64 comparison's sensitivity is not float64's: {comparison.tally.sensitivity}")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_factor_of_the_world_size_fails_without_a_float64_confirmation():
    report = shared_report(*WORLD_SIZE_FACTOR)
    assert str(report.verdict) == "failed", report.text()
    assert "confirm" not in report.timings, (
        f"a gradient off by a factor of the world size was computed again in float64: {report.timings}")


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_per_rank_normaliser_fails_in_float64_too_and_says_so():
    report = run_check_script(os.path.join(LOOPS, "num_boxes.py"), ["--batch-size", "{24 // world_size}"],
                              ranks=(1, 2), steps=2)
    text = report.text()
    assert str(report.verdict) == "failed", text
    assert "computed in float64 world 2 parts from world 1 too" in text, f"the float64 runs' finding not said:\n{text}"
