"""The check core both checks share (mgpu/check/: findings, divergence, report, the command ending),
held to its rules directly, so that a defect planted in the core fails here whichever check would
have hidden it.

    pytest correctness/test_check_core.py
"""

from __future__ import annotations

import pytest
import torch

from mgpu.check.divergence import Divergence
from mgpu.check.findings import CATALOGUE, ZERO_GRADIENTS, Finding, ZeroGradientWords, zero_gradients_finding
from mgpu.check.model.check import ZERO_GRADIENT_WORDS as MODEL_WORDS
from mgpu.check.model.compare import ModelDivergence
from mgpu.check.report import CheckReport, Verdict
from mgpu.check.script.divergence import ScriptDivergence
from mgpu.check.script.findings import ZERO_GRADIENT_WORDS as SCRIPT_WORDS
from mgpu.errors import ConfigError, LaunchError, NonFiniteLossError, end_command

WORDS = ZeroGradientWords("of the steps", "step(s)", "agrees")


def test_a_finding_outside_the_one_catalogue_cannot_be_made():
    with pytest.raises(ValueError, match="not in mgpu.check.findings.CATALOGUE"):
        Finding("zero-gradient", "a misspelt name")
    assert Finding(ZERO_GRADIENTS, "x")["name"] == ZERO_GRADIENTS
    assert all(meaning.startswith(("(c)", "(s)", "(c, s)")) for meaning in CATALOGUE.values()), \
        "each catalogue entry says which check makes it"


def test_zero_gradients_is_found_when_every_gradient_is_zero_or_none_and_only_then():
    zero, one = torch.zeros(3), torch.tensor([0.0, 1e-30, 0.0])
    found = zero_gradients_finding([{"w": zero, "b": None}, {"w": zero, "b": zero}], WORDS)
    assert found is not None and found.name == ZERO_GRADIENTS
    assert found.text.startswith("every gradient of the steps is zero (2 step(s), 2 parameter(s)): a loss "
                                 "that cannot move the weights agrees"), found.text
    assert zero_gradients_finding([{"w": zero}, {"w": one}], WORDS) is None, "one gradient not zero, at step 2"
    assert zero_gradients_finding([{"w": torch.tensor([float("nan")])}], WORDS) is None, "NaN is no zero"
    assert zero_gradients_finding([], WORDS) is None and zero_gradients_finding([{}], WORDS) is None, "nothing recorded"


def test_each_check_says_the_zero_gradients_finding_in_its_own_words():
    steps = [{"w": torch.zeros(2)}]
    model = zero_gradients_finding(steps, MODEL_WORDS).text
    script = zero_gradients_finding(steps, SCRIPT_WORDS).text
    assert model.startswith("every gradient of the single-device steps is zero (1 reference step(s) from the "
                            "initial weights, 1 parameter(s)): a loss that cannot move the weights agrees under any "
                            "strategy, so the comparisons proved nothing"), model
    assert script.startswith("every gradient world 1 recorded is zero (1 step(s), 1 parameter(s)): a loss that "
                             "cannot move the weights passes any comparison of gradients, so this one checked "
                             "little"), script


def test_a_divergence_is_described_by_the_check_that_found_it():
    fields = dict(tensor="fc.weight", rank=1, max_abs=1e-3, max_rel=1e-2, allowed=1e-6)
    model = ModelDivergence(2, against="the single-device float64 run", **fields).describe()
    script = ScriptDivergence(2, kind="gradient", diagnosis="every gradient is 0.500 x world 1's", **fields).describe()
    assert model == ("fc.weight differs after step 2 on replica 1 from the single-device float64 run: largest "
                     "absolute error 1.000e-03, relative 1.000e-02 (allowed 1.00e-06)"), model
    assert script == ("at step 2, gradient fc.weight: error 1.000e-03 against world 1 (allowed 1.000e-06; "
                      "relative 1.000e-02): every gradient is 0.500 x world 1's"), script
    with pytest.raises(TypeError, match="abstract"):
        Divergence(2, **fields)  # no words of its own: only a check's kind of divergence can be made
    assert ModelDivergence(1, **fields).to_json()["replica"] == 1 == ScriptDivergence(1, **fields).to_json()["rank"]


class _Report(CheckReport):
    def __init__(self, verdict, findings=()):
        self.verdict, self.findings = verdict, list(findings)

    def first_failure(self, strict=False):
        return "first"

    def text(self):
        return "text"

    def to_json(self):
        return {"verified": self.verified}


@pytest.mark.parametrize("verdict, verified, code", [(Verdict.PASSED, True, 0), (Verdict.FAILED, False, 1),
                                                      (Verdict.NOT_VERIFIED, False, 3)])
def test_verified_means_one_thing_for_both_checks_the_verdict_passed(verdict, verified, code):
    report = _Report(verdict)
    assert report.verified is verified and report.exit_code() == code, (verdict, report.verified, report.exit_code())
    assert _Report(verdict, [Finding(ZERO_GRADIENTS, "x")]).exit_code(strict=True) == (code or 1)


@pytest.mark.parametrize("raised, code, line", [
    (ConfigError("--steps must be a positive integer"), 2, "mgpu: error: --steps must be a positive integer\n"),
    (NonFiniteLossError("loss is nan\n at step 3"), 1, "mgpu: error: loss is nan at step 3\n"),
    (LaunchError("rank 1 failed: RuntimeError: boom\nTraceback ..."), 1,
     "mgpu: error: rank 1 failed: RuntimeError: boom\nTraceback ...\n"),
    (KeyboardInterrupt(), 130, "mgpu: interrupted: every rank stopped\n"),
])
def test_every_command_ends_the_same_way(raised, code, line, capsys):
    """train, check and check-script end through mgpu.errors.end_command: train names its failures
    (a rank's error, a NaN loss: exit 1); a check's are in its report, so there they are bad input (2)."""
    def run():
        raise raised

    assert end_command(run, failures=(LaunchError, NonFiniteLossError)) == code
    assert capsys.readouterr().err == line
    assert end_command(lambda: 7) == 7
