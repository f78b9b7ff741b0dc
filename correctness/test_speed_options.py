"""--amp bf16, --channels-last and --data-on-device: what each changes, and what it must not.

Correctness elsewhere stays in fp32 and contiguous memory; these tests pin the options themselves:
bf16 autocast really runs (the forward's matmuls in bfloat16) while weights and the SGD step stay
fp32; channels-last computes the same training within float32 rounding; --data-on-device changes
nothing on the CPU and, on a GPU, nothing but where the data lives (bitwise, same batch order).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import requires_gpus
from correctness.helpers import (assert_stepwise_close, assert_tensors_close, reference_trajectory, run_config,
                                 stepwise_configs)
from mgpu import devices as devmod
from mgpu.cli import main
from mgpu.config import TrainConfig
from mgpu.errors import ConfigError, DeviceError
from mgpu.run import train

BASE = TrainConfig(strategy="single", model="resnet18", width=4, epochs=1, batch_size=16, train_size=64,
                   test_size=40, lr=0.05, out=None, progress=False, seed=3)


@pytest.fixture(scope="module")
def fp32_run():
    return train(BASE)


def test_amp_bf16_autocasts_the_forward_but_keeps_fp32_weights(fp32_run, monkeypatch):
    seen = []
    original = torch.nn.functional.linear

    def spy(x, weight, bias=None):
        out = original(x, weight, bias)
        seen.append(out.dtype)
        return out
    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    amp = train(dataclasses.replace(BASE, amp="bf16"))
    assert torch.bfloat16 in seen, f"the classifier ran in {set(seen)}: autocast did not engage"
    assert all(v.dtype in (torch.float32, torch.int64) for v in amp.state_dict.values()), \
        {k: v.dtype for k, v in amp.state_dict.items() if v.dtype not in (torch.float32, torch.int64)}
    assert all(torch.isfinite(v).all() for v in amp.state_dict.values() if v.is_floating_point())
    differs = any(not torch.equal(amp.state_dict[k], v) for k, v in fp32_run.state_dict.items())
    assert differs, "bf16 training gave bitwise the fp32 weights: the option changed nothing"


@pytest.mark.rounding
@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2)])
def test_channels_last_trains_the_same_within_float32_rounding(strategy, n, tmp_path):
    # LeNet: a convolution followed by BatchNorm (ResNet-18's first layer) has a weight gradient that
    # is a near-cancelling sum, so any change of summation order (channels-last is one) moves it by
    # percents, and SGD amplifies that: measured 2e-2 on a gradient of 1.2 for a width-4 ResNet-18
    # on 8 images. Without BatchNorm the same option must agree within float32 tolerance, step by
    # step from the contiguous run's state (other kernels round otherwise: test_weights says why).
    cfg = run_config(strategy, n, model="lenet", epochs=3, batch_size=16, train_size=24, test_size=8, lr=0.05,
                     momentum=0.9, seed=3)  # one step an epoch
    reference = reference_trajectory(cfg, tmp_path / "contiguous")
    results = [train(c) for c in stepwise_configs(reference, strategy, n, tmp_path, channels_last=True)]
    assert_stepwise_close(results, reference, f"{strategy} channels-last")


def test_channels_last_places_weights_and_inputs_in_that_layout():
    from mgpu.strategies import get_strategy

    strategy = get_strategy("single").create(BASE.devices, BASE.strategy_settings())
    strategy.use_speed_options("off", channels_last=True)
    strategy.setup(__import__("mgpu.models", fromlist=["build_model"]).build_model("resnet18", width=4), lambda p: None)
    # The first convolution has one input channel (both layouts coincide there): take the next.
    conv = next(m.weight for m in strategy.model.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels > 1)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous(), conv.stride()
    (X,) = strategy.inputs(torch.rand(2, 3, 8, 8), strategy.devices[0])
    assert X.is_contiguous(memory_format=torch.channels_last) and not X.is_contiguous(), X.stride()


@pytest.mark.parametrize("strategy, n", [("single", 1), ("manual", 2)])
def test_data_on_device_changes_nothing_on_the_cpu(strategy, n):
    cfg = dataclasses.replace(BASE, strategy=strategy, devices=n, model="lenet")
    plain, on_device = train(cfg), train(dataclasses.replace(cfg, data_on_device=True))
    assert_tensors_close(on_device.state_dict, plain.state_dict, exact=True, where=f"{strategy} --data-on-device on CPU")


def test_unknown_amp_mode_is_a_config_error_and_one_cli_line(capsys):
    with pytest.raises(ConfigError, match="unknown amp 'fp16': choose one of off, bf16"):
        dataclasses.replace(BASE, amp="fp16").validate()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--amp", "fp16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and err == ["mgpu: error: unknown amp 'fp16': choose one of off, bf16"], err


def test_amp_bf16_on_a_device_without_bf16_is_a_device_error(monkeypatch):
    monkeypatch.setattr(devmod, "supports_bf16", lambda device: False)
    with pytest.raises(DeviceError, match="--amp bf16 needs bfloat16 support, which cpu lacks"):
        train(dataclasses.replace(BASE, amp="bf16", device="cpu"))


def test_a_dataset_larger_than_free_device_memory_is_refused_from_its_size(monkeypatch):
    monkeypatch.setattr(devmod, "free_memory", lambda device: 10 * 2**20)
    with pytest.raises(DeviceError, match=r"the dataset \(47 MiB\) does not fit in cuda:0's free memory \(10 MiB\)"):
        devmod.check_fits(47 * 2**20, "cuda:0")
    devmod.check_fits(10**12, "cpu")  # the CPU holds what is already in memory


@requires_gpus(1)
@pytest.mark.parametrize("strategy", ["single", "manual"])
def test_data_on_device_on_a_gpu_gives_bitwise_the_same_training(strategy):
    n = torch.cuda.device_count() if strategy == "manual" else 1
    cfg = dataclasses.replace(BASE, strategy=strategy, devices=n, device="cuda")
    plain, on_device = train(cfg), train(dataclasses.replace(cfg, data_on_device=True))
    assert_tensors_close(on_device.state_dict, plain.state_dict, exact=True, where=f"{strategy} --data-on-device on GPU")


@pytest.mark.parametrize("fault", ["no-bf16", "no-room"])
def test_ddp_refuses_gpu_options_before_any_rank_starts(fault, monkeypatch):
    """Under ddp the checks run in the launcher (exit 2 from the CLI), not in every rank: here
    with two pretend GPUs, one lacking bf16 or with 1 KiB free; a rank started would fail on them."""
    monkeypatch.setattr(devmod, "gpu_count", lambda: 2)
    monkeypatch.setattr(devmod, "supports_bf16", lambda device: torch.device(device).index != 1)
    monkeypatch.setattr(devmod, "free_memory", lambda device: 1024)
    from mgpu import launch
    monkeypatch.setattr(launch, "spawn", lambda *a, **k: pytest.fail("a rank was started"))
    cfg = dataclasses.replace(BASE, strategy="ddp", devices=2, **({"amp": "bf16"} if fault == "no-bf16"
                                                                    else {"data_on_device": True}))
    message = "which cuda:1 lacks" if fault == "no-bf16" else r"the dataset \(\d+ MiB\) does not fit in cuda:0's free memory"
    with pytest.raises(DeviceError, match=message):
        train(cfg)


def test_dataparallel_replica_threads_autocast_to_bf16_not_cudas_default(monkeypatch):
    """nn.DataParallel runs replicas in threads that re-enter autocast without its dtype (float16 on
    CUDA): the strategy's wrapper must set bfloat16 in the calling thread itself. Checked on the CPU
    by calling the wrapper from a fresh thread, as parallel_apply does: without CUDA, torch leaves
    CUDA autocast disabled (with a warning) but sets its dtype, which is what the wrapper decides."""
    import contextlib
    import threading

    from mgpu.strategies.dataparallel import _AutocastForward

    seen = {}

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen["dtype"] = torch.get_autocast_dtype("cuda")
            return x

    fresh = {}
    probe = threading.Thread(target=lambda: fresh.update(dtype=torch.get_autocast_dtype("cuda")))
    probe.start()
    probe.join()
    assert fresh["dtype"] == torch.float16, f"a fresh thread's CUDA autocast dtype: {fresh} (the premise)"
    wrapped = _AutocastForward(Probe(), torch.bfloat16)
    thread = threading.Thread(target=lambda: wrapped(torch.zeros(1)))
    with pytest.warns(UserWarning, match="CUDA") if not torch.cuda.is_available() else contextlib.nullcontext():
        thread.start()
        thread.join()
    assert seen == {"dtype": torch.bfloat16}, seen
