"""Device discovery: fallback rules and errors (this machine has no GPU; GPU cases are gated)."""

import pytest
import torch

from conftest import gpu_count, requires_gpus
from mgpu import devices as devmod
from mgpu.errors import ConfigError, DeviceError


def test_try_all_gpus_never_returns_an_empty_list(monkeypatch):
    monkeypatch.setattr(devmod, "gpu_count", lambda: 0)
    assert devmod.try_all_gpus() == [torch.device("cpu")], "no GPUs must give [cpu], not []"


def test_try_all_gpus_lists_every_gpu(monkeypatch):
    monkeypatch.setattr(devmod, "gpu_count", lambda: 3)
    assert devmod.try_all_gpus() == [torch.device(f"cuda:{i}") for i in range(3)]


def test_try_gpu_falls_back_to_cpu(monkeypatch):
    monkeypatch.setattr(devmod, "gpu_count", lambda: 1)
    assert devmod.try_gpu(0) == torch.device("cuda:0")
    assert devmod.try_gpu(1) == torch.device("cpu"), "a GPU index past the last GPU must give the CPU"


@pytest.mark.parametrize("bad", [-1, 1.5, "0", None])
def test_try_gpu_rejects_bad_index(bad):
    with pytest.raises(ConfigError, match="GPU index"):
        devmod.try_gpu(bad)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_devices_emulates_on_cpu_when_gpus_are_short(monkeypatch, n):
    monkeypatch.setattr(devmod, "gpu_count", lambda: 0)
    devs = devmod.devices(n)
    assert devs == [torch.device("cpu")] * n
    assert devs.emulated == (n > 1), f"{n} CPU device(s) must be reported as emulated={n > 1}"
    if n > 1:
        assert "emulated" in devmod.describe(devs)


def test_devices_uses_real_gpus_when_there_are_enough(monkeypatch):
    monkeypatch.setattr(devmod, "gpu_count", lambda: 4)
    devs = devmod.devices(2)
    assert devs == [torch.device("cuda:0"), torch.device("cuda:1")] and not devs.emulated
    assert devmod.describe(devs) == "[device(type='cuda', index=0), device(type='cuda', index=1)]"


@pytest.mark.parametrize("n", [0, -3])
def test_devices_rejects_non_positive_counts(n):
    with pytest.raises(ConfigError, match="at least 1"):
        devmod.devices(n)


@pytest.mark.parametrize("n", [2.0, "2", True])
def test_devices_rejects_non_integer_counts(n):
    with pytest.raises(ConfigError, match="integer"):
        devmod.devices(n)


def test_demanding_more_real_gpus_than_exist_is_an_error(monkeypatch):
    monkeypatch.setattr(devmod, "gpu_count", lambda: 1)
    with pytest.raises(DeviceError, match="2 GPU\\(s\\) demanded but 1 CUDA device\\(s\\) found"):
        devmod.devices(2, require_gpus=True)


def test_synchronize_is_a_noop_on_cpu():
    devmod.synchronize([torch.device("cpu")] * 3)  # must neither fail nor initialise CUDA
    assert not torch.cuda.is_initialized()


@requires_gpus(1)
def test_synchronize_waits_for_gpu_work():
    x = torch.rand(2000, 2000, device="cuda:0")
    y = x @ x
    devmod.synchronize([torch.device("cuda:0")])
    assert torch.cuda.current_stream().query(), "stream still busy after synchronize"
    assert y.shape == (2000, 2000)


def test_gpu_count_matches_torch():
    assert gpu_count() == torch.cuda.device_count()
