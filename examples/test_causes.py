"""Two of check-script's causes, rule by rule, in one process (no ranks): the order of the data and the
learning-rate schedule (docs/guide/check-script.md, "Causes and the evidence they need"). The public
scripts that need them, checked whole, are examples/test_public.py's accelerate_cv_batch_arg cases.

    pytest examples/test_causes.py
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from mgpu.check.script.causes.data import order_cause
from mgpu.check.script.causes.optimizer import schedule_cause
from mgpu.check.script.data import StepData, data_divergence
from mgpu.check.script.inrank.feeds import FeedWatch
from mgpu.check.script.inrank.settings import settings_of
from mgpu.check.script.optimizer import setting_divergence

RANDOM = "torch.utils.data.sampler.RandomSampler"
BATCH = "torch.utils.data.sampler.BatchSampler"
SHARD = "accelerate.data_loader.BatchSamplerShard"


def _other_examples(loaders_1: tuple, loaders_n: tuple, step: int = 1):
    """A step whose 16 examples at world 2 are none of world 1's, with these samplers seen."""
    sd = StepData([f"a{i}" for i in range(16)], [[f"b{i}" for i in range(8)], [f"c{i}" for i in range(8)]], 1, [1, 1],
                  loaders_1=loaders_1, loaders_n=loaders_n)
    return data_divergence(step, sd, 2, "Net", "")


def test_the_recorder_sees_the_sampler_that_ordered_the_data_and_the_scheduler_that_stepped():
    data = TensorDataset(torch.arange(40.0).unsqueeze(1))
    param = torch.nn.Parameter(torch.zeros(1))
    watch = FeedWatch()
    original = DataLoader.__iter__
    watch.install()
    try:
        opt = torch.optim.Adam([param], lr=1e-3)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=45)
        for _ in DataLoader(data, batch_size=4, shuffle=True):
            break
        for _ in DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=0, seed=3)):
            break
        for _ in range(2):
            opt.step()
            sched.step()
        loaders, schedulers = watch.loaders(), watch.schedulers(opt)
    finally:
        watch.uninstall()
    assert DataLoader.__iter__ is original, "uninstall must give DataLoader its own __iter__ back"
    assert loaders == ((BATCH, RANDOM), (BATCH, "torch.utils.data.distributed.DistributedSampler")), loaders
    assert schedulers == [{"type": "OneCycleLR", "steps": 2, "length": 45, "by": __name__}], schedulers


def test_other_examples_under_accelerates_unseeded_shuffle_name_use_seedable_sampler():
    d = _other_examples(((BATCH, RANDOM),), ((SHARD, BATCH, RANDOM),))
    assert "0 of 16 shared" in d.diagnosis and "use_seedable_sampler=True" in d.diagnosis, d.describe()
    assert "BatchSamplerShard over BatchSampler over RandomSampler" in d.diagnosis, d.describe()
    assert "seeded by rank" not in d.diagnosis, f"a guess where the samplers tell: {d.describe()}"
    # accelerate's seedable sampler orders alike at every world size: what differs is not the order
    seeded = _other_examples(((BATCH, "accelerate.data_loader.SeedableRandomSampler"),),
                             ((SHARD, BATCH, "accelerate.data_loader.SeedableRandomSampler"),))
    assert "use_seedable_sampler" not in seeded.diagnosis and "the order agrees" in seeded.diagnosis, seeded.describe()
    assert "random augmentation drawn per rank" in seeded.diagnosis and "seeded by rank" not in seeded.diagnosis, \
        seeded.describe()


def test_other_examples_from_two_samplers_or_no_loader_get_the_general_rule_or_the_guesses():
    two = _other_examples(((BATCH, RANDOM),), ((BATCH, "torch.utils.data.distributed.DistributedSampler"),))
    assert "world 1 orders its data with BatchSampler over RandomSampler" in two.diagnosis, two.describe()
    assert "another sampler at each world size" in two.diagnosis and "set_epoch" in two.diagnosis, two.describe()
    # nanoGPT draws its batches with torch.randint: no DataLoader, so the samplers say nothing
    none = _other_examples((), ())
    assert "seeded by rank" in none.diagnosis and order_cause(StepData([], [], 1, []), 2, 1) == "", none.describe()
    # a difference that starts later is no shuffle drawn otherwise (that shows at the first step)
    later = _other_examples(((BATCH, RANDOM),), ((SHARD, BATCH, RANDOM),), step=3)
    assert "use_seedable_sampler" not in later.diagnosis, later.describe()


def _seen_at(make, per_step: int, steps: int = 2) -> tuple[list, list]:
    """(settings, scheduler facts) at optimizer step `steps`, as the recorder sees them, of the optimizer
    and scheduler `make(param)` returns, the scheduler stepped `per_step` times an optimizer step."""
    param = torch.nn.Parameter(torch.zeros(1))
    watch = FeedWatch()
    watch.install()
    try:
        opt, sched = make(param)
        seen = []
        for _ in range(steps):
            seen.append((settings_of(opt), watch.schedulers(opt)))
            opt.step()
            for _ in range(per_step):
                sched.step()
    finally:
        watch.uninstall()
    return seen[-1]


def _one_cycle_lrs(total: int, per_step: int) -> tuple[list, list]:
    """OneCycleLR over `total` scheduler steps (_seen_at)."""
    def make(param):
        opt = torch.optim.Adam([param], lr=1.2e-3)
        return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-2, total_steps=total)
    return _seen_at(make, per_step)


def test_a_one_cycle_schedule_twice_as_long_stepped_twice_as_often_is_another_schedule_not_another_pace():
    (got, got_s), (ref, ref_s) = _one_cycle_lrs(90, 2), _one_cycle_lrs(45, 1)
    d = setting_divergence(2, got, ref, 2, agreed=True, schedulers=(got_s, ref_s))
    assert d is not None and d.tensor == "lr of param group 0", d
    assert d.detail == "world 2 0.00161844, world 1 0.0016524", d.describe()
    assert "another pace" not in d.diagnosis and "another one at this world size, at the same pace" in d.diagnosis, \
        d.describe()
    assert "OneCycleLR had made 2 scheduler step(s) of 90 at world 2, 1 of 45 at world 1" in d.diagnosis, d.describe()
    assert "pct_start * total_steps - 1" in d.diagnosis and "once per optimizer step" in d.diagnosis, d.describe()
    # stepped by accelerate's prepared scheduler: its switch and where the length comes from
    by = [dict(s, by="accelerate.scheduler") for s in got_s]
    acc = schedule_cause(by, ref_s, 2)
    assert "step_scheduler_with_optimizer=False" in acc and "len(train_dataloader) after accelerator.prepare" in acc, acc


def test_a_schedule_stepped_twice_as_often_over_the_same_length_runs_at_another_pace():
    got = [{"type": "LinearLR", "steps": 2, "length": 50, "by": "accelerate.scheduler"}]
    ref = [{"type": "LinearLR", "steps": 1, "length": 50, "by": "accelerate.scheduler"}]
    pace = schedule_cause(got, ref, 2)
    assert pace.startswith("the learning-rate schedule runs at another pace") and "2 x world 1's pace" in pace, pace
    assert "accelerate steps a prepared scheduler" in pace, pace
    counted = schedule_cause([dict(got[0], steps=1, length=25, by="__main__")], [dict(ref[0], by="__main__")], 2)
    assert "2 x world 1's pace" in counted and "length 0.5 x world 1's" in counted, counted
    # no scheduler recorded (a schedule computed by hand): the rule does not guess from the schedulers
    assert schedule_cause([], [], 2) == ""


def _warmup_lrs(lr: float, per_step: int) -> tuple[list, list]:
    """A linear warmup over 100 scheduler steps (transformers' get_linear_schedule_with_warmup is this
    LambdaLR) of AdamW at `lr` (_seen_at)."""
    def make(param):
        opt = torch.optim.AdamW([param], lr=lr)
        return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, k / 100))
    return _seen_at(make, per_step)


def test_a_learning_rate_scaled_by_n_under_a_warmup_stepped_n_times_names_both_factors():
    # accelerate's gradient_accumulation_for_autoregressive_models.py with lr * num_processes and a warmup (unseen
    # scripts, 2026-11-26): at step 2 world 2's lr is 4 x world 1's, 2 x from the base and 2 x from the prepared
    # scheduler stepped twice an optimizer step; the base alone was named, as if it made all of the 4 x
    (got, got_s), (ref, ref_s) = _warmup_lrs(4e-5, 2), _warmup_lrs(2e-5, 1)
    d = setting_divergence(2, got, ref, 2, agreed=False, schedulers=(got_s, ref_s))
    assert d is not None and d.tensor == "lr of param group 0" and d.detail == "world 2 8e-07, world 1 2e-07", d
    assert "4 x world 1's" in d.diagnosis and "linear scaling rule" in d.diagnosis, d.describe()
    assert "initial_lr, is 2 x world 1's" in d.diagnosis, d.describe()
    assert "beyond its base, the learning rate is 2 x more" in d.diagnosis, f"the other 2 x unnamed: {d.describe()}"
    assert "LambdaLR had made 2 scheduler step(s) at world 2, 1 at world 1" in d.diagnosis, d.describe()
    assert "(its base learning rate agrees)" not in d.diagnosis, f"said of a base that differs: {d.describe()}"
    # the base explains all of it (the learning rate scaled, the schedule stepped alike): nothing more is said
    (got_1, got_1s), (ref_1, ref_1s) = _warmup_lrs(4e-5, 1), _warmup_lrs(2e-5, 1)
    alone = setting_divergence(2, got_1, ref_1, 2, agreed=False, schedulers=(got_1s, ref_1s))
    assert alone is not None and "2 x world 1's = N" in alone.diagnosis, alone
    assert "beyond its base" not in alone.diagnosis, alone.describe()
