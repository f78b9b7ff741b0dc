"""The vision loops of examples/loops/ with random augmentation, through `mgpu check-script` (issue 55): a
correct loop whose Dataset augments at random (torchvision v2 transforms; numpy and Python's `random`), with and
without DataLoader workers, persistent or not, over a Subset, passes, its augmentation keyed to the example
(mgpu/check/script/inrank/keyed.py); the same augmentation under a sampler bug fails at step 1 naming the data; noise
drawn per rank in the training step, MixUp in collate_fn and a generator held by the dataset are NOT VERIFIED
with where they are drawn; every rank seeded alike before augmentation or noise is named (same-random-numbers).

    pytest examples/test_loops_aug.py

As test_loops.py: 4 optimizer steps, world 1 against 2 ranks, the global batch kept with `{16 // world_size}`.
`make test` runs one of each family; the rest are `slow`.
"""

from __future__ import annotations

import os

import pytest

from mgpu.scriptcheck import run_check_script

LOOPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loops")

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]

BATCH = ["--batch-size", "{16 // world_size}"]
SLOW = pytest.mark.slow


def check(script: str, args: list):
    return run_check_script(os.path.join(LOOPS, script), BATCH + args, ranks=(1, 2), steps=4)


# script, ARGS: correct loops with random augmentation, each passing with no finding
CORRECT = [
    pytest.param("aug_torchvision.py", ["--workers", "2", "--persistent"], id="torchvision-persistent_workers"),
    pytest.param("aug_torchvision.py", [], id="torchvision-main_process", marks=SLOW),
    pytest.param("aug_torchvision.py", ["--workers", "2"], id="torchvision-workers", marks=SLOW),
    # spawned workers inherit nothing: check-script's worker_init_fn wrapper keys them (about 60 s: each imports torch)
    pytest.param("aug_torchvision.py", ["--workers", "2", "--start-method", "spawn"], id="torchvision-spawn_workers",
                 marks=[SLOW, pytest.mark.timeout(600)]),
    # mixed precision as it is run beside augmentation: fp16 autocast with a GradScaler (the check compares as run)
    pytest.param("aug_torchvision.py", ["--workers", "2", "--amp", "fp16"], id="torchvision-workers-fp16_gradscaler",
                 marks=SLOW),
    pytest.param("aug_numpy.py", ["--subset"], id="numpy_random-subset"),
    pytest.param("aug_numpy.py", ["--subset", "--workers", "2"], id="numpy_random-subset-workers", marks=SLOW),
    pytest.param("aug_numpy.py", [], id="numpy_random", marks=SLOW),
    pytest.param("noise_step.py", ["--no-noise"], id="noise_step-off", marks=SLOW),
]


@pytest.mark.parametrize("script, args", CORRECT)
def test_correct_augmented_loops_pass(script, args):
    report = check(script, args)
    assert report.verdict == "passed", report.text()
    c = report.comparisons[0]
    assert c.status == "pass" and c.steps == 4, report.text()
    assert not report.findings, [f.text for f in report.findings]
    if "--no-noise" not in args:
        assert any("keyed to the example" in n for n in report.notes), report.notes


# sampler bugs under augmentation: FAILED at step 1, the data named
SAMPLER_BUGS = [
    pytest.param("aug_torchvision.py", ["--sampler", "rank"], ["other examples", "other dataset indices"],
                 id="torchvision-sampler_seeded_by_rank"),
    pytest.param("aug_torchvision.py", ["--sampler", "none", "--workers", "2"], ["every rank saw the same examples"],
                 id="torchvision-no_distributed_sampler", marks=SLOW),
]


@pytest.mark.parametrize("script, args, words", SAMPLER_BUGS)
def test_a_sampler_bug_under_augmentation_fails_at_step_1_naming_the_data(script, args, words):
    report = check(script, args)
    assert report.verdict == "failed" and report.exit_code() == 1, report.text()
    d = report.comparisons[0].first
    assert (d.kind, d.step) == ("data", 1), d.describe(2)
    for word in words:
        assert word in d.diagnosis, f"{word!r} not in {d.describe(2)}"
    assert "augmented otherwise" not in d.diagnosis.replace("not the same ones augmented otherwise", "")


# randomness the check cannot key: NOT VERIFIED (exit 3), where it is drawn named, never a data-order failure
NOT_KEYABLE = [
    pytest.param("noise_step.py", [], ["torch.randn_like in the training step at noise_step.py:"], id="noise_in_step"),
    pytest.param("noise_step.py", ["--noise-module"], ["torch.randn_like in the training step at noise_step.py:",
                                                        "in GaussianNoise (a module without parameters"],
                 id="noise_module_in_step", marks=SLOW),
    pytest.param("aug_torchvision.py", ["--mixup"], ["collate_fn mixup"], id="mixup_in_collate_fn", marks=SLOW),
    pytest.param("aug_numpy.py", ["--rng"], ["NumpyImages.rng (numpy.Generator), held by the dataset"],
                 id="generator_held_by_the_dataset", marks=SLOW),
]


@SLOW
def test_batches_drawn_per_rank_in_the_step_are_a_choice_not_verified():
    """nanoGPT's get_batch (torch.randint, seeded 1337 + rank): not FAILED as a bug; every rank seeded alike
    (the same batch on every rank) still is."""
    report = check("randint_batches.py", [])
    assert report.verdict == "not verified" and report.exit_code() == 3, report.text()
    d = report.comparisons[0].first
    assert d.kind == "data" and "drawn at random in the training step" in d.diagnosis, d.describe(2)
    assert "torch.randint in the training step at randint_batches.py:" in d.diagnosis and "get_batch" in d.diagnosis
    alike = check("randint_batches.py", ["--seed-alike"])
    assert alike.verdict == "failed" and "every rank saw the same examples" in alike.comparisons[0].first.diagnosis


@pytest.mark.parametrize("script, args, words", NOT_KEYABLE)
def test_randomness_that_cannot_be_keyed_is_not_verified_and_named(script, args, words):
    report = check(script, args)
    assert report.verdict == "not verified" and report.exit_code() == 3, report.text()
    d = report.comparisons[0].first
    assert report.comparisons[0].status == "finding" and d.kind == "data", report.text()
    assert "cannot key to the example" in d.diagnosis and "the same examples" in d.diagnosis, d.describe(2)
    for word in words:
        assert word in d.diagnosis, f"{word!r} not in {d.describe(2)}"
    if "held by the dataset" not in words[0]:  # a generator held is a suspect the divergence names, not a draw seen
        randomness = next(f for f in report.findings if f.name == "randomness")
        assert words[0] in randomness.text, randomness.text


# every rank seeded alike before the draws: named (which generator, where seeded, what to do)
SEEDED_ALIKE = [
    pytest.param("noise_step.py", ["--seed-alike"], "not verified",
                 ["every rank draws the same torch.randn_like", "torch.manual_seed(0) at noise_step.py:"],
                 id="noise_seeded_alike"),
    pytest.param("aug_torchvision.py", ["--seed-alike", "--workers", "2"], "passed",
                 ["worker seeds are equal on every rank", "manual_seed(seed + rank)"],
                 id="torchvision_workers_seeded_alike", marks=SLOW),
    pytest.param("aug_torchvision.py", ["--seed-alike"], "passed",
                 ["torch's global generator is in the same state on every rank when the Dataset's __getitem__",
                  "torch.manual_seed(0) at aug_torchvision.py:"], id="torchvision_seeded_alike", marks=SLOW),
]


@pytest.mark.parametrize("script, args, verdict, words", SEEDED_ALIKE)
def test_ranks_that_draw_the_same_random_numbers_are_named(script, args, verdict, words):
    report = check(script, args)
    assert report.verdict == verdict, report.text()
    finding = next((f for f in report.findings if f.name == "same-random-numbers"), None)
    assert finding is not None, report.text()
    for word in words:
        assert word in finding.text, f"{word!r} not in {finding.text}"
    if verdict == "passed":
        assert report.exit_code() == 0 and report.exit_code(strict=True) == 1, "a finding: --strict fails it"
