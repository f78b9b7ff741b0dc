"""The training loops of examples/loops/ in mixed precision, through `mgpu check-script`: correct loops
under bf16 and fp16 autocast (AdamW, clipping, a cosine schedule; a GradScaler for fp16), a model cast
whole to bf16, HF Trainer `bf16=True` (a tiny Llama), accelerate `mixed_precision="bf16"` and FSDP2's
`MixedPrecisionPolicy` pass; each planted defect of examples/test_loops.py, run under bf16 autocast (and
some with the model cast whole to bf16), fails at the same step with the same diagnosis as its float32
twin (a loop bug does not depend on the precision).

    pytest examples/test_loops_amp.py

World N differs from world 1 by bf16 (fp16) rounding here, 2^16 (2^13) times float32's: a check whose
tolerance is sized for float32 calls every correct loop below wrong. As test_loops.py: 4 optimizer
steps, world 1 against 2 ranks (3 as well, marked slow), the global batch kept with `{B // world_size}`.
`make test` runs four of them (bf16 and fp16 autocast, a model cast whole, a planted defect); the
rest are `slow` (`make test-slow`): each mixed-precision check makes five runs.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from mgpu.scriptcheck import run_check_script

LOOPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loops")

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

BF16, FP16 = ["--amp", "bf16"], ["--amp", "fp16"]
CAST_BF16 = ["--model-dtype", "bfloat16"]  # the model cast whole: no autocast


def _needs(module: str):
    if importlib.util.find_spec(module) is None:
        return [pytest.mark.skip(reason=f"needs {module}: pip install 'mgpu[models]'")]
    return []


def per_device(total: int, flag: str = "--batch-size") -> list[str]:
    return [flag, f"{{{total} // world_size}}"]


HEAVY = [pytest.mark.slow, pytest.mark.timeout(600)]
HF = [*HEAVY, *_needs("transformers")]
ACCELERATE = _needs("accelerate")
LLAMA_BF16 = ["--model", "llama", "--bf16"]

# script, ARGS, worlds (besides 1), the low precision the loop computes at (its report names it)
CORRECT = [
    pytest.param("ddp_amp.py", per_device(48) + BF16, (2,), "bfloat16", id="ddp_autocast_bf16"),
    pytest.param("ddp_amp.py", per_device(48) + BF16, (3,), "bfloat16", id="ddp_autocast_bf16-1v3",
                 marks=pytest.mark.slow),
    pytest.param("ddp_amp.py", per_device(48) + FP16, (2,), "float16", id="ddp_autocast_fp16_gradscaler"),
    pytest.param("ddp_amp.py", per_device(48) + FP16, (3,), "float16", id="ddp_autocast_fp16_gradscaler-1v3",
                 marks=pytest.mark.slow),
    pytest.param("ddp_amp.py", per_device(48) + ["--amp", "off"] + CAST_BF16, (2,), "bfloat16",
                 id="ddp_model_cast_bf16"),
    pytest.param("ddp_amp.py", per_device(48) + ["--amp", "off"] + CAST_BF16, (3,), "bfloat16",
                 id="ddp_model_cast_bf16-1v3", marks=pytest.mark.slow),
    pytest.param("lm_global_tokens.py", per_device(24) + CAST_BF16, (2,), "bfloat16", id="lm_global_tokens-cast_bf16",
                 marks=pytest.mark.slow),
    pytest.param("fsdp2.py", per_device(24) + ["--mixed-precision", "bf16"], (2,), "bfloat16",
                 id="fsdp2_mixed_precision_policy", marks=pytest.mark.slow),
    pytest.param("fsdp2.py", per_device(24) + ["--mixed-precision", "bf16"], (3,), "bfloat16",
                 id="fsdp2_mixed_precision_policy-1v3", marks=pytest.mark.slow),
    pytest.param("lm_global_tokens.py", per_device(24) + BF16, (2,), "bfloat16", id="lm_global_tokens-bf16",
                 marks=pytest.mark.slow),
    pytest.param("allreduce.py", per_device(48) + BF16, (2,), "bfloat16", id="allreduce-bf16",
                 marks=pytest.mark.slow),
    pytest.param("accelerate_loop.py", per_device(48) + ["--mixed-precision", "bf16"], (2,), "bfloat16",
                 id="accelerate_bf16", marks=[*HEAVY, *ACCELERATE]),
    pytest.param("hf_trainer.py", per_device(16, "--per-device") + LLAMA_BF16, (2,), "bfloat16",
                 id="hf_trainer_llama_bf16", marks=HF),
    pytest.param("hf_trainer.py", per_device(24, "--per-device") + LLAMA_BF16, (3,), "bfloat16",
                 id="hf_trainer_llama_bf16-1v3", marks=HF),
]

# script, ARGS, worlds, then for each world: (kind, step, words the diagnosis must hold): the float32 twin's
DEFECTS = [
    pytest.param("lm_token_mean.py", per_device(24) + BF16, (2,), ("gradient", 1, ["no common factor", "per rank"]),
                 id="per_rank_token_mean-bf16"),
    pytest.param("lm_token_mean.py", per_device(24) + CAST_BF16, (2,),
                 ("gradient", 1, ["no common factor", "per rank"]),
                 id="per_rank_token_mean-cast_bf16", marks=pytest.mark.slow),
    pytest.param("world_size_factor.py", per_device(24) + BF16, (2,), ("gradient", 1, ["= 1/N", "divided once more"]),
                 id="world_size_factor-bf16", marks=pytest.mark.slow),  # make test: per_rank_token_mean-bf16, and its float32 twin in test_loops
    pytest.param("world_size_factor.py", per_device(24) + BF16, (3,), ("gradient", 1, ["= 1/N", "divided once more"]),
                 id="world_size_factor-bf16-1v3", marks=pytest.mark.slow),
    pytest.param("world_size_factor.py", per_device(24) + CAST_BF16, (2,),
                 ("gradient", 1, ["= 1/N", "divided once more"]), id="world_size_factor-cast_bf16",
                 marks=pytest.mark.slow),
    pytest.param("clip_norm_twice.py", per_device(48) + BF16, (2,),
                 ("gradient", 1, ["= 1/sqrt(N)", "norm reduced twice"]), id="norm_reduced_twice-bf16", marks=pytest.mark.slow),
    pytest.param("clip_norm_twice.py", per_device(48) + BF16, (3,),
                 ("gradient", 1, ["= 1/sqrt(N)", "norm reduced twice"]), id="norm_reduced_twice-bf16-1v3",
                 marks=pytest.mark.slow),
    pytest.param("clip_norm_twice.py", per_device(48) + CAST_BF16, (2,),
                 ("gradient", 1, ["= 1/sqrt(N)", "norm reduced twice"]), id="norm_reduced_twice-cast_bf16", marks=pytest.mark.slow),
    pytest.param("no_sampler.py", per_device(48) + BF16, (2,),
                 ("data", 1, ["every rank saw the same examples", "DistributedSampler"]), id="no_sampler-bf16", marks=pytest.mark.slow),
    pytest.param("accum_per_microbatch.py", per_device(12, "--micro-batch") + ["--accumulate", "2"] + BF16, (2,),
                 ("gradient", 1, ["per micro-batch", "2 per rank"]), id="accumulation_per_microbatch-bf16", marks=pytest.mark.slow),
    pytest.param("replicas_apart.py", per_device(48) + BF16, (2,), ("ranks", 0, ["replicas start apart", "broadcast"]),
                 id="replicas_apart-bf16", marks=pytest.mark.slow),
    pytest.param("replicas_apart.py", per_device(48) + BF16, (3,), ("ranks", 0, ["replicas start apart", "broadcast"]),
                 id="replicas_apart-bf16-1v3", marks=pytest.mark.slow),
    # the correct bf16 loop above with a fixed per-device batch: the global batch grows with the world size
    pytest.param("ddp_amp.py", ["--batch-size", "16"] + BF16, (2,),
                 ("data", 1, ["global batch changed size", "per-device batch size"]), id="per_device_batch_size-bf16", marks=pytest.mark.slow),
    pytest.param("ddp_amp.py", ["--batch-size", "16"] + FP16, (2,),
                 ("data", 1, ["global batch changed size", "per-device batch size"]),
                 id="per_device_batch_size-fp16_gradscaler", marks=pytest.mark.slow),
    pytest.param("accelerate_scheduler.py", per_device(48) + ["--mixed-precision", "bf16"], (2,),
                 ("setting", 2, ["world 2 0.001928, world 1 0.001964", "schedule runs at another pace",
                                 "accelerate steps a prepared scheduler"]), id="accelerate_scheduler-bf16",
                 marks=[*HEAVY, *ACCELERATE]),
    pytest.param("hf_trainer_token_mean.py", per_device(16, "--per-device") + LLAMA_BF16, (2,),
                 ("gradient", 1, ["no common factor", "per rank"]), id="hf_trainer_token_mean-llama_bf16", marks=HF),
]


@pytest.mark.parametrize("script, args, worlds, precision", CORRECT)
def test_correct_mixed_precision_loops_pass(script, args, worlds, precision):
    report = run_check_script(os.path.join(LOOPS, script), args, ranks=(1, *worlds), steps=4)
    text = report.text()
    assert report.verdict == "passed" and report.exit_code() == 0, text
    assert sorted({c.world for c in report.comparisons}) == list(worlds), text
    for c in report.comparisons:
        assert c.status == "pass" and c.steps == 4, f"world {c.world}: {text}"
        assert 0 < c.worst["gradient"]["ratio"] < 1 and c.worst["weight"]["ratio"] < 1, f"world {c.world}: {c.worst}"
    assert precision in text, f"the report does not say the loop ran in {precision}: {text}"
    assert "sensitivity" in text, f"the report does not state its sensitivity: {text}"


@pytest.mark.parametrize("script, args, worlds, expected", DEFECTS)
def test_planted_defects_in_mixed_precision_fail_at_their_step_with_their_diagnosis(script, args, worlds, expected):
    kind, step, words = expected
    report = run_check_script(os.path.join(LOOPS, script), args, ranks=(1, *worlds), steps=4)
    text = report.text()
    assert report.verdict == "failed" and report.exit_code() == 1, text
    for world in worlds:
        failed = [c for c in report.comparisons if c.world == world and c.status == "fail"]
        assert failed and all(c.first is not None for c in failed), f"world {world}: no divergence: {text}"
        # The world's first failure (the one the report leads with) names the float32 twin's step and cause;
        # a comparison of this world that fails (a later one may, as run at low precision) fails no earlier.
        d = failed[0].first
        assert (d.kind, d.step) == (kind, step), f"world {world}: {d.describe()}"
        for word in words:
            assert word in d.diagnosis or word in d.detail, f"world {world}: {word!r} not in {d.describe()}"
        assert min(c.first.step for c in failed) == step, f"world {world}: one fails before step {step}: {text}"
    print(report.summary())
