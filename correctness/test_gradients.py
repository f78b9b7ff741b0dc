"""Property 1: after one backward pass, the manual strategy's allreduced gradient equals the
single-device gradient of the whole batch, on every replica.

Hypothesis draws the batch size B >= n (divisible by n or not, B = n, shards of one example),
the device count n in 1..4 (real GPUs where there are that many, else emulated on the CPU), the
seed and so the weights and data. The manual strategy backpropagates *summed* shard losses and
divides the allreduced sum by the global batch; a strategy that averaged per-shard means would be
wrong exactly when the shards are uneven, which these batch sizes include.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from correctness.helpers import (assert_tensors_close, make_model, manual_gradients,
                                 random_batch, reference_gradients)
from correctness.strategies import batch_and_devices, seeds


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@settings(max_examples=15)
@given(case=batch_and_devices(max_devices=4, max_batch=24), seed=seeds)
def test_lenet_allreduced_gradient_equals_single_device_gradient(reduction, case, seed):
    check_allreduced_gradient("lenet", reduction, case, seed)


# ResNet-18's 17 convolutions amplify oneDNN's batch-size-dependent rounding past float32
# tolerances: these run on PyTorch's native CPU convolution (see helpers.native_cpu_conv).
@pytest.mark.usefixtures("native_cpu_conv")
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@settings(max_examples=8)
@given(case=batch_and_devices(max_devices=4, max_batch=12), seed=seeds)
def test_resnet18_allreduced_gradient_equals_single_device_gradient(reduction, case, seed):
    check_allreduced_gradient("resnet18", reduction, case, seed)


def check_allreduced_gradient(model_name, reduction, case, seed):
    batch_size, n = case
    model = make_model(model_name, seed)
    # ResNet-18's BatchNorm layers run in eval mode here: in training mode each device normalises
    # its shard with the shard's own statistics, which changes the function being differentiated
    # (test_batchnorm.py shows that difference and its fixes).
    model.eval() if model_name == "resnet18" else model.train()
    X, y = random_batch(batch_size, seed)
    strategy, replica_grads = manual_gradients(model, X, y, n, reduction)
    # The reference runs on the manual strategy's first device: on GPUs, the same kind of device.
    expected = reference_gradients(model, X, y, reduction, device=strategy.devices[0])
    for device_index, grads in enumerate(replica_grads):
        assert_tensors_close(grads, expected, where=(
            f"{model_name}, {reduction} loss, batch {batch_size} over {n} device(s), seed {seed}: "
            f"allreduced gradient on device {device_index} ({strategy.devices[device_index]}) vs single device"))
