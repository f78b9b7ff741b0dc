"""Device discovery: fallback rules and errors (this machine has no GPU; GPU cases are gated)."""

import os
import platform
import sys

import pytest
import torch

from conftest import requires_gpus
from correctness.processes import run_to_end
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


# -- placement: pure rules, pinned against simulated GPU counts (0, 1, 2, 8) ---------------------------

CPU, CUDA = torch.device("cpu"), lambda i: torch.device(f"cuda:{i}")


@pytest.mark.parametrize("gpus, n, auto, emulated", [
    (0, 1, [CPU], False), (0, 3, [CPU] * 3, True),
    (1, 1, [CUDA(0)], False), (1, 2, [CPU] * 2, True),  # one GPU: two devices go to the CPU, both of them
    (2, 2, [CUDA(0), CUDA(1)], False), (2, 3, [CPU] * 3, True),
    (8, 3, [CUDA(0), CUDA(1), CUDA(2)], False), (8, 8, [CUDA(i) for i in range(8)], False),
])
def test_place_auto_takes_gpus_only_when_there_is_one_per_device(gpus, n, auto, emulated):
    got = devmod.place(n, gpus, "auto")
    assert got == auto and got.emulated == emulated, f"{n} devices beside {gpus} GPUs: {got!r} (emulated {got.emulated})"
    cpu = devmod.place(n, gpus, "cpu")
    assert cpu == [CPU] * n and cpu.emulated == (n > 1), f"--device cpu beside {gpus} GPUs: {cpu!r}"


@pytest.mark.parametrize("gpus, n", [(0, 1), (1, 2), (2, 3), (8, 9)])
def test_place_cuda_refuses_fewer_gpus_than_devices(gpus, n):
    with pytest.raises(DeviceError, match=rf"^{n} GPU\(s\) demanded but {gpus} CUDA device\(s\) found$"):
        devmod.place(n, gpus, "cuda")


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_ranks_get_nccl_with_a_gpu_each_else_gloo_on_the_cpu_for_all(gpus):
    for world in (1, 2, 3, 8):
        placed = [devmod.rank_placement(r, world, gpus) for r in range(world)]
        if gpus >= world:
            assert placed == [(CUDA(r), "nccl") for r in range(world)], f"{world} ranks beside {gpus} GPUs: {placed}"
        else:  # never two ranks on one GPU, never nccl and gloo ranks in one group
            assert placed == [(CPU, "gloo")] * world, f"{world} ranks beside {gpus} GPUs: {placed}"
        assert [devmod.rank_placement(r, world, gpus, "cpu") for r in range(world)] == [(CPU, "gloo")] * world


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_a_comparison_runs_on_one_device_kind(gpus):
    """Its one-device reference and its multi-device runs all on the GPUs, or all on the CPU."""
    for most in (1, 2, 3, 8):
        kind = devmod.comparison_kind(most, gpus)
        assert kind == ("cuda" if gpus >= most else "cpu"), f"up to {most} devices beside {gpus} GPUs: {kind}"
        kinds = {d.type for n in range(1, most + 1) for d in devmod.place(n, gpus, kind)}
        assert len(kinds) == 1, f"up to {most} devices beside {gpus} GPUs: the runs span {kinds}"


def test_two_ranks_given_one_gpu_of_one_host_are_found_before_nccl():
    assert devmod.shared_gpus([("a", "cuda 0"), ("b", "cuda 0")]) == [], "one GPU on each of two hosts is fine"
    assert devmod.shared_gpus([("a", "cpu"), ("a", "cpu")]) == [], "gloo ranks share the CPU"
    assert devmod.shared_gpus([("a", "cuda 0"), ("a", "cuda 1"), ("a", "cuda 0")]) == [(0, 2, "cuda 0")]


def test_devices_follows_the_kind_and_refuses_a_contradiction(monkeypatch):
    monkeypatch.setattr(devmod, "gpu_count", lambda: 1)
    assert devmod.devices(1) == [CUDA(0)] and devmod.devices(1, kind="cpu") == [CPU]
    with pytest.raises(ConfigError, match="contradict"):
        devmod.devices(1, require_gpus=True, kind="cpu")


def test_cli_device_cpu_and_exact_gpu_math_reach_the_run(tmp_path, capsys):
    from mgpu.cli import main

    code = main(["train", "--strategy", "manual", "--devices", "2", "--device", "cpu", "--exact-gpu-math",
                 "--model", "lenet", "--epochs", "1", "--batch-size", "32", "--train-size", "64", "--test-size", "16",
                 "--no-progress", "--out", str(tmp_path)])
    assert code == 0
    import json

    config = json.loads((tmp_path / "results.json").read_text())["config"]
    assert (config["device"], config["exact_gpu_math"]) == ("cpu", True), config
    assert capsys.readouterr().out.strip().endswith("on [cpu (emulated 0), cpu (emulated 1)]")


def test_synchronize_is_a_noop_on_cpu(monkeypatch):
    # No CUDA call for CPU devices, beside GPUs too (where an earlier test may have initialised CUDA).
    def no_cuda(*args):
        raise AssertionError(f"torch.cuda.synchronize{args} called for CPU devices")

    monkeypatch.setattr(torch.cuda, "synchronize", no_cuda)
    devmod.synchronize([torch.device("cpu")] * 3)


@requires_gpus(1)
def test_synchronize_waits_for_gpu_work():
    x = torch.rand(2000, 2000, device="cuda:0")
    x @ x  # queued: synchronize must wait for it
    devmod.synchronize([torch.device("cuda:0")])
    assert torch.cuda.current_stream().query(), "stream still busy after synchronize"


# How many bytes a fresh process's glibc malloc serves by mmap for one 31 MiB block: by default a
# block that size gets a mapping of its own (faulted in and zeroed on every use, unmapped on free);
# after keep_freed_memory it comes from the heap, which keeps freed memory for the next step.
_MAPPED_BYTES_FOR_31_MIB = """
import ctypes, sys
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
if sys.argv[1] == "keep":
    from mgpu.memory import keep_freed_memory  # as mgpu.devices re-exports it, without torch
    assert keep_freed_memory(), "mallopt refused"
before = libc.mallinfo2().hblkhd
block = libc.malloc(31 << 20)
print(libc.mallinfo2().hblkhd - before)
"""


def _glibc_with_mallinfo2() -> bool:
    libc, version = platform.libc_ver()
    return sys.platform.startswith("linux") and libc == "glibc" and tuple(map(int, version.split("."))) >= (2, 33)


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="keep_freed_memory tunes glibc's malloc (glibc 2.33+ to check)")
def test_keep_freed_memory_serves_activation_sized_blocks_from_the_heap():
    def mapped(mode: str) -> int:
        out = run_to_end([sys.executable, "-c", _MAPPED_BYTES_FOR_31_MIB, mode])
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    assert mapped("default") >= 31 << 20, "glibc no longer maps a 31 MiB block: this check shows nothing"
    assert mapped("keep") == 0, "keep_freed_memory did not raise malloc's mmap threshold"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity to set on this platform")
def test_usable_cores_lists_this_process_cores_not_the_machines():
    cores = devmod.usable_cores()
    assert cores == sorted(os.sched_getaffinity(0)), cores
    saved = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cores[-1]})  # this process on one core: the machine still has them all
        assert devmod.usable_cores() == [cores[-1]]
    finally:
        os.sched_setaffinity(0, saved)


def test_torch_threads_gives_back_the_count_from_before_the_block():
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    with devmod.torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        with devmod.torch_threads():  # None: the count stays; whatever the block sets is undone
            assert torch.get_num_threads() == before
            torch.set_num_threads(other)  # as a ddp strategy's create() does
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before


def _gpu_math_flags() -> tuple:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)


def test_exact_gpu_math_switches_tf32_off_and_cudnn_to_deterministic_then_gives_the_settings_back():
    with devmod.exact_gpu_math():  # this folder's autouse fixture already set them: start from defaults
        saved = devmod.set_exact_gpu_math([True, True, False, True])  # in _gpu_math_flags' order
        assert _gpu_math_flags() == (True, True, False, True)
        with devmod.exact_gpu_math():
            assert _gpu_math_flags() == (False, False, True, False), "TF32 on or cuDNN free to pick nondeterministic kernels"
        assert _gpu_math_flags() == (True, True, False, True), "the settings from before the block were not given back"
        devmod.set_exact_gpu_math(saved)


@requires_gpus(1)
def test_two_identical_resnet_runs_on_a_gpu_agree_bitwise_under_exact_gpu_math():
    # What exact_gpu_math is for: cuDNN's default weight gradients changed from run to run on an H200.
    import dataclasses

    from correctness.helpers import assert_tensors_close
    from mgpu.config import TrainConfig
    from mgpu.run import train

    cfg = TrainConfig(strategy="single", model="resnet18", width=4, epochs=1, batch_size=16, train_size=64,
                      test_size=16, lr=0.05, out=None, progress=False, seed=3, require_gpus=True)
    with devmod.exact_gpu_math():
        first, second = train(cfg), train(dataclasses.replace(cfg))
    assert_tensors_close(second.state_dict, first.state_dict, exact=True, where="ResNet-18 on cuda:0, second run vs first")
