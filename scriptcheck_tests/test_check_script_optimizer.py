"""check-script's optimizer side (mgpu/check/script/optimizer.py) and what it compares after a first
difference (compare.py): each step's param_groups settings against world 1's, exactly; each step's
update against world 1's, within its tolerance, with Adam's signs of rounding-level gradients told
from a bug; the checks that need no world-1 data still run after the data differ.

    pytest scriptcheck_tests/test_check_script_optimizer.py

The record-level tests step a real torch AdamW on gradients made here and compare the records as
the judge does (compare.compare_world), in this process; the others run a script at 1 and 2 ranks.
"""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
import torch

from mgpu.check.script.inrank.records import RankRecord, StepRecord
from mgpu.scriptcheck import run_check_script
from mgpu.check.script.compare import compare_world
from mgpu.check.script.causes.facts import ScriptFacts
from mgpu.check.script.inrank.settings import settings_of
from mgpu.check.script.optimizer import ranks_settings_apart, same_setting, setting_divergence, steps_text

from scriptcheck_tests.test_check_script import LOOP

pytestmark = [pytest.mark.reliability]

LR = 1e-3
ROUNDING = 1e-7   # a gradient element at rounding level: within the gradient's tolerance of zero


# -- settings -------------------------------------------------------------------------------------------------

def test_settings_are_every_param_group_key_but_params_as_plain_values():
    w = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([w], lr=torch.tensor(2e-3), betas=(0.8, 0.99), weight_decay=0.1)
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    (settings,) = settings_of(opt)
    assert "params" not in settings, settings
    assert settings["lr"] == pytest.approx(1e-3) and isinstance(settings["lr"], float), settings
    assert settings["initial_lr"] == pytest.approx(2e-3) and settings["betas"] == (0.8, 0.99), settings
    assert settings["weight_decay"] == 0.1 and settings["amsgrad"] is False, settings


def test_settings_agree_within_a_few_float64_ulps_and_no_further():
    lr = 0.1 * 3
    assert same_setting(lr, 0.3) and same_setting((0.9, lr), (0.9, 0.3)), "one rounding apart must agree"
    assert not same_setting(0.3, 0.3 * (1 + 1e-12)), "a relative 1e-12 is no rounding of float64"
    assert not same_setting(0.9, 0.95) and not same_setting(True, False) and same_setting(float("nan"), float("nan"))


def test_a_learning_rate_scaled_by_the_world_size_is_named_and_a_schedule_at_another_pace_told_apart():
    one = [{"lr": 1e-3, "weight_decay": 0.01}]
    scaled = setting_divergence(1, [{"lr": 2e-3, "weight_decay": 0.01}], one, 2, agreed=False)
    assert scaled is not None and (scaled.kind, scaled.tensor) == ("setting", "lr of param group 0"), scaled
    assert "linear scaling rule" in scaled.diagnosis and "= N" in scaled.diagnosis, scaled.describe()
    assert scaled.describe().startswith("at step 1, optimizer setting lr of param group 0: world 2 0.002, world 1 "
                                        "0.001: 2 x world 1's = N"), scaled.describe()
    # a warmup from zero stepped twice as fast (accelerate's per-process scheduler): its base agrees
    pace = setting_divergence(2, [{"lr": 2e-6, "initial_lr": 1e-3}], [{"lr": 1e-6, "initial_lr": 1e-3}], 2,
                              agreed=False)
    assert "another pace" in pace.diagnosis and "linear scaling rule" not in pace.diagnosis, pace.describe()
    decay = setting_divergence(3, [{"lr": 1e-3, "weight_decay": 0.02}], one, 2, agreed=True)
    assert decay.tensor == "weight_decay of param group 0" and "set from the world size" in decay.diagnosis, decay
    assert setting_divergence(1, one, [dict(one[0])], 2, agreed=False) is None


def test_settings_that_differ_between_ranks_are_a_ranks_divergence():
    d = ranks_settings_apart(3, [[{"lr": 1e-3}], [{"lr": 1e-3}], [{"lr": 5e-4}]])
    assert d is not None and (d.kind, d.rank, d.step) == ("ranks", 2, 3), d
    assert "optimizer setting lr" in d.tensor and "set by rank" in d.diagnosis, d.describe()


def test_steps_are_written_as_ranges():
    assert steps_text([0, 1, 2, 3, 5]) == "before step 1, steps 1-3, 5"
    assert steps_text([2]) == "step 2"


# -- updates, on records of real AdamW steps ----------------------------------------------------------------

def _run(world: int, grads: list, hidden_scale: float = 1.0):
    """A run's records: AdamW stepped on one 4x8 weight from the same start with the given gradient at
    each step; `hidden_scale` multiplies the learning rate the step uses but not the one recorded (a
    step size kept outside param_groups)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 8))
    opt = torch.optim.AdamW([w], lr=LR)
    steps = []
    for k, g in enumerate(grads, 1):
        before, settings = w.detach().clone(), settings_of(opt)
        w.grad = g.clone()
        opt.param_groups[0]["lr"] = LR * hidden_scale
        opt.step()
        opt.param_groups[0]["lr"] = LR
        steps.append(StepRecord(0, k, "AdamW", [], {"fc.weight": g.clone()}, after={"fc.weight": w.detach().clone()},
                                before={"fc.weight": before} if k == 1 else None, settings=settings))
    return SimpleNamespace(world=world, ranks=[RankRecord(steps=steps, world=world) for _ in range(world)])


def _gradients(steps: int, flipped_at: tuple = (1,)):
    """World 1's gradients, its rerun B's (each element moved by about two float32 roundings), and
    world 2's: world 1's, but at the steps `flipped_at` three elements are at rounding level, with
    the other sign at world 2."""
    gen = torch.Generator().manual_seed(1)
    one, b, two = [], [], []
    for k in range(1, steps + 1):
        g = torch.randn(4, 8, generator=gen) * 0.1
        if k in flipped_at:
            g.view(-1)[:3] = ROUNDING * torch.tensor([1.0, -1.0, 1.0])
        sign = torch.randint(0, 2, (4, 8), generator=gen) * 2 - 1
        one.append(g)
        b.append(g + 2.0 ** -22 * (g.abs() + g.pow(2).mean().sqrt()) * sign)
        n = g.clone()
        if k in flipped_at:
            n.view(-1)[:3] *= -1
        two.append(n)
    return one, b, two


def test_adam_signs_of_rounding_level_gradients_are_rounding_not_an_optimizer_setting():
    one, b, two = _gradients(3)
    c = compare_world(_run(2, two), _run(1, one), _run(1, b), ScriptFacts(), "")
    assert c.status == "pass" and c.first is None, c.first and c.first.describe()
    note = " ".join(c.notes)
    assert "in 3 element(s) whose gradient is at rounding level" in note and "fc.weight: 3 at step 1" in note, note
    assert "AdamW's first step turns rounding-sized gradients into lr*sign(g)" in note, note
    assert "rounding, not a bug" in note and "optimizer setting" not in note, note
    assert c.tally.compared["update"] == 3 and c.tally.compared["weight"] == 3, c.tally.compared
    # the three weights now differ by about 2 lr: the weight comparison after steps 2-3 passed without them
    assert c.worst["weight"]["ratio"] < 1, c.worst


def test_an_update_that_differs_beyond_the_rounding_level_elements_fails_without_blaming_a_setting():
    one, b, two = _gradients(1)
    c = compare_world(_run(2, two, hidden_scale=1.5), _run(1, one), _run(1, b), ScriptFacts(), "")
    d = c.first
    assert c.status == "fail" and (d.kind, d.step, d.tensor) == ("update", 1, "fc.weight"), d and d.describe()
    assert "3 of the 32 element(s) that differ have a gradient at rounding level" in d.diagnosis, d.describe()
    assert "rounding, not a bug" in d.diagnosis and "every param_groups setting agree" in d.diagnosis, d.describe()


def test_a_later_divergence_names_the_signs_of_rounding_that_came_before_it():
    one, b, two = _gradients(2)
    two[1] = two[1] * 1.5  # world 2's gradients at step 2: 1.5 x world 1's
    c = compare_world(_run(2, two), _run(1, one), _run(1, b), ScriptFacts(), "")
    d = c.first
    assert (d.kind, d.step) == ("gradient", 2), d.describe()
    assert "every gradient is 1.500 x world 1's" in d.diagnosis, d.describe()
    assert "earlier, at step 1, AdamW's update of fc.weight took the other sign in 3 element(s)" in d.diagnosis, \
        d.describe()


# -- whole scripts at 1 and 2 ranks ----------------------------------------------------------------------------

def _script(tmp_path, text: str, shuffle: str = "pass") -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text).format(before_step="pass", in_forward="pass", seed="torch.manual_seed(0)",
                                                 shuffle=shuffle, steps=20))
    return str(path)


# A step size outside param_groups: an SGD whose step multiplies the learning rate by the world size.
SCALED_STEP = LOOP.replace("    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", '''\
    class Scaled(torch.optim.SGD):
        def step(self, closure=None):
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.add_(p.grad, alpha=-group["lr"] * world)
    opt = Scaled(model.parameters(), lr=0.1)
''')


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_an_update_that_is_c_times_world_1s_is_named_at_its_step(tmp_path):
    assert "class Scaled" in SCALED_STEP, "the loop's optimizer line moved: the plant is not in"
    report = run_check_script(_script(tmp_path, SCALED_STEP), ranks=(1, 2), steps=2)
    c = report.comparisons[0]
    d = c.first
    assert report.verdict == "failed" and (d.kind, d.step) == ("update", 1), report.text()
    assert "every update is 2.000 x world 1's = N" in d.diagnosis, d.describe()
    assert "gradients against world 1 (step 1)" in c.compared and "update" in c.tally.compared, c.compared
    assert any("after step 1: world 2 parted from world 1 there (update)" in x for x in c.not_compared), c.not_compared


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_after_a_data_difference_the_ranks_are_still_checked_and_their_failure_reported(tmp_path):
    """Each rank shuffles with its own seed (the data differ from world 1's, by design) and no DDP
    synchronises the gradients: both are reported, and the report says what was not compared."""
    no_ddp = LOOP.replace("model = DDP(Net())", "model = Net()")
    assert no_ddp != LOOP, "the loop's DDP line moved: the plant is not in"
    path = _script(tmp_path, no_ddp, shuffle="random.Random(rank).shuffle(order)")
    report = run_check_script(path, ranks=(1, 2), steps=2)
    c = report.comparisons[0]
    assert report.verdict == "failed" and (c.first.kind, c.first.step) == ("data", 1), report.text()
    assert [(d.kind, d.step, d.rank) for d in c.later] == [("ranks", 1, 1)], report.text()
    assert "not synchronised" in c.later[0].diagnosis, c.later[0].describe()
    assert "optimizer settings against world 1 (steps 1-2)" in c.compared, c.compared
    assert any(x.startswith("gradients, updates and weights against world 1 from step 1: the data differ")
               for x in c.not_compared), c.not_compared
    text = report.text()
    assert "also FAILED at step 1, gradient fc1.weight on rank 1" in text and "not compared:" in text, text
    record = report.to_json()["comparisons"][0]
    assert record["later_divergences"][0]["kind"] == "ranks" and record["not_compared"], record
