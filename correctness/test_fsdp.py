"""The fsdp strategy's own pieces: what gets a `fully_shard`, tied weights, state in and out,
bf16 through FSDP's mixed-precision policy.

Parity with single-device training is checked where every strategy's is: test_parity (the
checks of `mgpu check` on 2 ranks, LeNet and ResNet-18), test_weights and test_evaluation (the
shared rank runs), test_memory, and test_reliability_ranks (the CLI end to end, kill and resume,
two torchrun "nodes"). Tests here that need a process group run a world of one rank in this
process (helpers.run_job_in_this_process): FSDP's code paths, without a spawn.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from correctness.check_models import TiedLM
from correctness.helpers import (COMPARISON_KIND, TrainJob, assert_tensors_close, run_config, run_job_in_this_process,
                                 weights_config)
from mgpu import checkpoint
from mgpu.config import CheckOptions
from mgpu.models import Residual, build_model
from mgpu.parity import run_check
from mgpu.run import train
from mgpu.spec import load_spec
from mgpu.strategies.fsdp import shard_units


def test_block_sharding_gives_each_residual_block_and_each_layer_a_fully_shard():
    resnet = build_model("resnet18", width=4)
    units = shard_units(resnet)
    residuals = [m for m in resnet.modules() if isinstance(m, Residual)]
    assert all(any(u is r for u in units) for r in residuals), "every residual block is a unit"
    assert not any(isinstance(u, (nn.Sequential, nn.ModuleList)) for u in units), "containers are descended into"
    assert not any(isinstance(m, Residual) for u in units for m in list(u.modules())[1:]), "no unit inside another"
    lenet = build_model("lenet")
    assert [type(u).__name__ for u in shard_units(lenet)] == [
        type(m).__name__ for m in lenet if any(True for _ in m.parameters())]


def test_tied_layers_stay_with_the_root_so_the_tie_survives():
    model = TiedLM()
    units = shard_units(model)
    assert model.mix in units, units
    assert model.embed not in units and model.head not in units, (
        "the embedding and the output layer share one weight: sharded apart, FSDP would keep two copies")


@pytest.mark.rounding
@pytest.mark.multiprocess
def test_fsdp_keeps_tied_weights_tied_and_matches_single_device():
    """The model also holds a buffer drawn when it is built (random features): ranks seeded apart
    draw different ones, and fsdp's start must copy rank 0's buffers too, not only its parameters."""
    report = run_check(load_spec("correctness/check_models.py:tied_lm"),
                       CheckOptions(strategies=("fsdp",), devices=(2,), step_timeout=30, device=COMPARISON_KIND))
    results = {r.name: r for r in report.results}
    assert results["ties"].status == "pass", results["ties"]
    assert results["start"].status == "pass" and results["buffers"].status == "pass", (results["start"], results["buffers"])
    assert not report.failures, [(r.name, r.first_divergence) for r in report.failures]


@pytest.mark.rounding
def test_fsdp_checkpoint_has_every_strategys_layout_and_resumes_from_a_single_device_one(tmp_path):
    """The full state, gathered by torch's helpers, keyed as Optimizer.state_dict() keys it: a
    checkpoint of fsdp and one of single hold the same tensors under the same keys, and a single
    device's checkpoint resumes under fsdp. One step an epoch (weights_config), so that each
    comparison is one step from a shared state (test_weights says why)."""
    single_dir, fsdp_dir = tmp_path / "single", tmp_path / "fsdp"
    one_epoch = dataclasses.replace(weights_config("single"), epochs=1)
    train(dataclasses.replace(one_epoch, checkpoint_dir=str(single_dir)))
    run_job_in_this_process(TrainJob(dataclasses.replace(one_epoch, strategy="fsdp", checkpoint_dir=str(fsdp_dir))))
    single, fsdp = checkpoint.load(single_dir), checkpoint.load(fsdp_dir)
    assert_tensors_close(fsdp["model"], single["model"], where="fsdp (one rank) vs single: checkpointed weights")
    assert fsdp["optimizer"]["param_groups"] == single["optimizer"]["param_groups"]
    assert fsdp["optimizer"]["state"].keys() == single["optimizer"]["state"].keys()
    for i, state in single["optimizer"]["state"].items():
        assert_tensors_close(fsdp["optimizer"]["state"][i], state, where=f"optimizer state of parameter {i}")
    two_epochs = dataclasses.replace(one_epoch, epochs=2)
    resumed = run_job_in_this_process(TrainJob(dataclasses.replace(two_epochs, strategy="fsdp",
                                                                   checkpoint_dir=str(single_dir), resume=True)))
    uninterrupted = train(two_epochs)
    assert_tensors_close(resumed.state_dict, uninterrupted.state_dict,
                         where="step 1 single, step 2 resumed under fsdp, vs 2 steps single")


def test_bf16_under_fsdp_computes_in_bf16_and_keeps_fp32_weights_and_gradients():
    """--amp bf16: FSDP's MixedPrecisionPolicy (bf16 compute, fp32 reduce), not autocast."""
    from mgpu.strategies import FullyShardedDataParallel
    from mgpu.strategies.base import Strategy

    seen = {}

    @dataclass
    class Job:
        amp: str

        def run(self, new_group=None):
            cfg = run_config("fsdp", 1, amp=self.amp)
            s = FullyShardedDataParallel.create(cfg.devices, cfg.strategy_settings())
            try:
                s.use_speed_options(self.amp)
                model = build_model("lenet", seed=0)
                model[0].register_forward_hook(lambda m, i, o: seen.__setitem__(self.amp, o.dtype))
                s.setup(model, lambda p: torch.optim.SGD(p, lr=0.1))
                X, y = torch.rand(8, 1, 28, 28, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 10
                stats = s.forward_backward(X, y, 8)
                grads = {n: p.grad.to_local().clone() for n, p in s.model.named_parameters()}
                assert Strategy.autocast(s, s.devices[0]).__class__.__name__ == "nullcontext"
                return stats, grads, {n: p.dtype for n, p in s.model.named_parameters()}
            finally:
                s.teardown()

    stats, grads, dtypes = run_job_in_this_process(Job("bf16"))
    plain_stats, plain_grads, _ = run_job_in_this_process(Job("off"))
    assert seen == {"bf16": torch.bfloat16, "off": torch.float32}, f"first layer's output dtypes: {seen}"
    assert set(dtypes.values()) == {torch.float32}, f"weights must stay fp32: {dtypes}"
    assert {g.dtype for g in grads.values()} == {torch.float32}, "gradients are reduced and kept in fp32"
    for name, g in plain_grads.items():
        # The whole forward in bf16 (8 bits of mantissa), LeNet's sigmoids included: measured up to 18 %
        # apart in norm from fp32 at the first layers, pointing the same way (cosine >= 0.985).
        rel = float((grads[name] - g).norm() / g.norm())
        cos = float(torch.nn.functional.cosine_similarity(grads[name].flatten(), g.flatten(), dim=0))
        assert rel < 0.3 and cos > 0.97, f"bf16 gradient of {name}: {rel:.3f} (relative norm) from fp32, cosine {cos:.4f}"
    assert any(not torch.equal(grads[k], plain_grads[k]) for k in grads), "bf16 computed exactly as fp32: not applied"
    assert abs(float(stats[0]) - float(plain_stats[0])) < 0.05 * abs(float(plain_stats[0]))
