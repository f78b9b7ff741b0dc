"""Property 5: without CUDA, the dataparallel strategy gives exactly the single-device result.

Why exactly: `nn.DataParallel` scatters over CUDA devices only. With none, it calls the wrapped
module directly, a pass-through, so the dataparallel strategy runs on one CPU device: the same
kernels on the same batches in the same order as `single`, hence bitwise-equal weights, losses
and accuracies. The run must also say so in its notes rather than claim several devices.
"""

from __future__ import annotations

import dataclasses

import pytest

from conftest import requires_gpus
from correctness.helpers import assert_tensors_close, weights_config
from mgpu.run import train


@pytest.mark.parametrize("n", [2, 3])
def test_dataparallel_on_the_cpu_is_exactly_the_single_device_run(n):
    # --device cpu: on the CPU beside GPUs too (with CUDA, the GPU runs are test_weights' and the next test's).
    cfg = dataclasses.replace(weights_config("single"), device="cpu")
    single = train(cfg)
    passthrough = train(dataclasses.replace(cfg, strategy="dataparallel", devices=n))
    where = f"dataparallel asked for {n} devices without CUDA vs single"
    assert_tensors_close(passthrough.state_dict, single.state_dict, exact=True, where=where)
    for mine, ref in zip(passthrough.epochs, single.epochs, strict=True):
        assert (mine.loss, mine.train_acc, mine.test_acc) == (ref.loss, ref.train_acc, ref.test_acc), \
            f"{where}: epoch {mine.epoch} loss/train acc/test acc {mine.loss, mine.train_acc, mine.test_acc} " \
            f"vs {ref.loss, ref.train_acc, ref.test_acc}"
    assert any("pass-through" in note for note in passthrough.notes), \
        f"{where}: the notes must say it ran as a pass-through on one CPU device, got {passthrough.notes}"


@requires_gpus(1)
def test_dataparallel_on_exactly_one_gpu_equals_the_single_gpu_run():
    """`nn.DataParallel(device_ids=[0])` calls the module directly (nothing to scatter): with TF32 off
    (the autouse fixture) the weights, losses and accuracies equal the single-GPU run's."""
    cfg = dataclasses.replace(weights_config("single"), device="cuda")
    single = train(cfg)
    one_gpu = train(dataclasses.replace(cfg, strategy="dataparallel", devices=1))
    assert "cuda" in one_gpu.devices and "cuda" in single.devices, (one_gpu.devices, single.devices)
    where = "dataparallel on one GPU vs single on that GPU"
    assert_tensors_close(one_gpu.state_dict, single.state_dict, where=where)
    for mine, ref in zip(one_gpu.epochs, single.epochs, strict=True):
        assert mine.test_acc == pytest.approx(ref.test_acc, abs=1 / 30), f"{where}: epoch {mine.epoch}"
    assert not any("pass-through" in note for note in one_gpu.notes), one_gpu.notes
