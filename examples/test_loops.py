"""Every training loop in examples/loops/ through `mgpu check-script`: the correct ones pass, each planted
defect fails at its first divergent step with its diagnosis.

    pytest examples/test_loops.py

Each case runs its script unchanged at world 1 (twice: the reference and its perturbed rerun, which
sizes the tolerance) and at 2 ranks (some at 3 as well, marked slow), 4 optimizer steps, on gloo.
The ARGS keep the global batch at every world size (`{48 // world_size}`), as a user would.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from mgpu.scriptcheck import check_script, run_check_script
from scriptcheck_tests.shared import shared_report, with_shared_runs

LOOPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loops")

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def _needs(module: str):
    if importlib.util.find_spec(module) is None:
        return [pytest.mark.skip(reason=f"needs {module}: pip install 'mgpu[models]'")]
    return []


def per_device(total: int, flag: str = "--batch-size") -> list[str]:
    return [flag, f"{{{total} // world_size}}"]


# script, ARGS, worlds (besides 1)
CORRECT = [
    pytest.param("ddp_sampler.py", per_device(48), (2,), id="ddp_sampler"),
    pytest.param("fsdp2.py", per_device(24), (2,), id="fsdp2"),
    pytest.param("fsdp2.py", per_device(24), (3,), id="fsdp2-1v3", marks=pytest.mark.slow),
    pytest.param("allreduce.py", per_device(48), (2,), id="allreduce", marks=pytest.mark.slow),
    pytest.param("accelerate_loop.py", per_device(48), (2,), id="accelerate",
                 marks=[pytest.mark.slow, *_needs("accelerate")]),
    pytest.param("ddp_no_sync.py", per_device(12, "--micro-batch") + ["--accumulate", "3"], (2,), id="ddp_no_sync"),
    pytest.param("warmup_lr_scaled.py", per_device(48) + ["--keep-lr"], (2,), id="warmup_lr_kept"),
    pytest.param("lm_global_tokens.py", per_device(24), (2,), id="lm_global_tokens", marks=pytest.mark.slow),
    pytest.param("lm_global_tokens.py", per_device(24), (3,), id="lm_global_tokens-1v3", marks=pytest.mark.slow),
    pytest.param("hf_trainer.py", per_device(16, "--per-device"), (2,), id="hf_trainer",
                 marks=[pytest.mark.slow, *_needs("transformers")]),
]

# script, ARGS, worlds, then for each world: (kind, step, words the diagnosis must hold)
DEFECTS = [
    pytest.param("lm_token_mean.py", per_device(24), (2,), ("gradient", 1, ["no common factor", "per rank"]),
                 id="per_rank_token_mean"),
    pytest.param("world_size_factor.py", per_device(24), (2,), ("gradient", 1, ["= 1/N", "divided once more"]),
                 id="world_size_factor"),
    pytest.param("world_size_factor.py", per_device(24), (3,), ("gradient", 1, ["= 1/N", "divided once more"]),
                 id="world_size_factor-1v3", marks=pytest.mark.slow),
    pytest.param("clip_norm_twice.py", per_device(48), (2,), ("gradient", 1, ["= 1/sqrt(N)", "norm reduced twice"]),
                 id="norm_reduced_twice"),
    pytest.param("clip_norm_twice.py", per_device(48), (3,), ("gradient", 1, ["= 1/sqrt(N)", "norm reduced twice"]),
                 id="norm_reduced_twice-1v3", marks=pytest.mark.slow),
    pytest.param("no_sampler.py", per_device(48), (2,), ("data", 1, ["every rank saw the same examples",
                                                                       "DistributedSampler"]), id="no_sampler"),
    pytest.param("num_boxes.py", per_device(24), (2,), ("gradient", 1, ["no common factor", "normaliser per rank"]),
                 id="num_boxes_per_rank", marks=pytest.mark.slow),
    pytest.param("accum_per_microbatch.py", per_device(12, "--micro-batch") + ["--accumulate", "2"], (2,),
                 ("gradient", 1, ["per micro-batch", "2 per rank"]), id="accumulation_per_microbatch"),
    pytest.param("replicas_apart.py", per_device(48), (2,), ("ranks", 0, ["replicas start apart", "broadcast"]),
                 id="replicas_apart"),
    pytest.param("replicas_apart.py", per_device(48), (3,), ("ranks", 0, ["replicas start apart", "broadcast"]),
                 id="replicas_apart-1v3", marks=pytest.mark.slow),
    pytest.param("ddp_sampler.py", ["--batch-size", "16"], (2,), ("data", 1, ["global batch changed size",
                                                                             "per-device batch size"]),
                 id="per_device_batch_size"),
    pytest.param("accelerate_scheduler.py", per_device(48), (2,),
                 ("setting", 2, ["world 2 0.001928, world 1 0.001964", "schedule runs at another pace",
                                 "accelerate steps a prepared scheduler"]),
                 id="accelerate_scheduler", marks=_needs("accelerate")),
    pytest.param("warmup_lr_scaled.py", per_device(48), (2,),
                 ("setting", 2, ["world 2 2e-06, world 1 1e-06", "= N", "linear scaling rule",
                                 "first drift at step 1: the schedule's initial_lr"]), id="warmup_lr_scaled"),
    pytest.param("hf_trainer_token_mean.py", per_device(16, "--per-device"), (2,),
                 ("gradient", 1, ["no common factor", "per rank"]), id="hf_trainer_token_mean",
                 marks=[pytest.mark.slow, *_needs("transformers")]),
]


@pytest.mark.parametrize("script, args, worlds", CORRECT)
def test_correct_loops_pass(script, args, worlds):
    report = run_check_script(os.path.join(LOOPS, script), args, ranks=(1, *worlds), steps=4)
    assert report.verdict == "passed", report.text()
    assert [c.world for c in report.comparisons] == list(worlds)
    for c in report.comparisons:
        assert c.status == "pass" and c.steps == 4, report.text()
        assert 0 < c.worst["gradient"]["ratio"] < 1 and c.worst["weight"]["ratio"] < 1, c.worst


def test_batchnorm_is_a_finding_and_the_rest_of_the_loop_is_checked():
    report = run_check_script(os.path.join(LOOPS, "ddp_batchnorm.py"), per_device(48), ranks=(1, 2), steps=4)
    assert report.verdict == "passed" and report.exit_code() == 0 and report.exit_code(strict=True) == 1, report.text()
    finding = next(f for f in report.findings if f["name"] == "batch-mixing")
    assert "1 (BatchNorm1d)" in finding["text"] and "SyncBatchNorm" in finding["text"]


@pytest.mark.parametrize("script, args, worlds, expected", DEFECTS)
def test_planted_defects_fail_at_their_step_with_their_diagnosis(script, args, worlds, expected):
    kind, step, words = expected
    # world_size_factor's run is shared (scriptcheck_tests/shared.py): test_check_script_raises_the_first_divergence
    # and test_locate read it too; the others are made here
    report = shared_report(os.path.join(LOOPS, script), args, ranks=(1, *worlds), steps=4)
    assert report.verdict == "failed" and report.exit_code() == 1, report.text()
    for c in report.comparisons:
        d = c.first
        assert c.status == "fail" and d is not None, report.text()
        assert (d.kind, d.step) == (kind, step), f"world {c.world}: {d.describe(c.world)}"
        for word in words:
            assert word in d.diagnosis or word in d.detail, f"world {c.world}: {word!r} not in {d.describe(c.world)}"
    print(report.summary())


# -- a user's own test, as docs/guide/check-script.md shows it (the GitHub workflow runs this one) -----------

def test_my_training_script():
    check_script(os.path.join(LOOPS, "ddp_sampler.py"), args=["--batch-size", "{32 // world_size}"],
                 ranks=(1, 2), steps=4)


def test_check_script_raises_the_first_divergence():
    """check_script's own code turns the failed report into the AssertionError; the run it reads is the
    planted defect's `world_size_factor` above (the same script, ARGS, ranks and steps: shared, made once)."""
    shared_report(os.path.join(LOOPS, "world_size_factor.py"), per_device(24), ranks=(1, 2), steps=4)
    with with_shared_runs(check_script), \
            pytest.raises(AssertionError, match=r"world 2 against world 1: at step 1, gradient .*= 1/N"):
        check_script(os.path.join(LOOPS, "world_size_factor.py"), args=per_device(24), ranks=(1, 2), steps=4)
