"""Property 4: BatchNorm in training mode breaks the equality of multi-device and single-device
gradients; SyncBatchNorm (under DDP, on GPUs) and eval mode restore it.

In training mode BatchNorm normalises with the mean and variance of the batch it sees. Split over
n devices, each replica normalises its shard with the shard's statistics, a different function of
the examples than normalising the whole batch with the whole batch's statistics, so the gradient
differs even though every other part of data parallelism is exact. This is what the chapter's
per-GPU BatchNorm does; it is a property of the method, not a bug of mgpu, and the first test
pins it down so that nobody "fixes" the gradient test by widening its tolerance.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import requires_gpus
from correctness.draws import batch_sizes_for, multi_batch_and_devices, seeds
from correctness.helpers import (DDP_DEADLINE_S, assert_tensors_close, make_model, manual_gradients,
                                 max_abs_diff, random_batch, reference_gradients,
                                 syncbn_gradients_in_rank)
from mgpu.launch import spawn

pytestmark = pytest.mark.rounding  # the rounding-sensitive part: make test runs it under other CPU kernels too

# torch.testing.assert_close's float32 defaults: the tolerance the matching tests use.
RTOL, ATOL = 1.3e-6, 1e-5


# Any example with 2+ devices shows it (each replica's shard differs from the whole batch): a few suffice.
@settings(max_examples=5)
@given(case=multi_batch_and_devices(max_devices=4, max_batch=16), seed=seeds)
def test_batchnorm_in_training_mode_makes_multi_device_gradients_differ(case, seed):
    batch_size, n = case
    model = make_model("resnet18", seed).train()
    X, y = random_batch(batch_size, seed)
    _, replica_grads = manual_gradients(model, X, y, n, "mean")
    expected = reference_gradients(model, X, y, "mean")
    # Per-shard statistics change the function itself, so the gradients must differ by more than
    # the float32 tolerance under which the eval-mode gradients below agree.
    differing = {name: max_abs_diff(g, expected[name]) for name, g in replica_grads[0].items()
                 if not torch.allclose(g, expected[name], rtol=RTOL, atol=ATOL)}
    assert differing, (f"batch {batch_size} over {n} devices, seed {seed}: with BatchNorm in training mode every "
                       "gradient matched the single-device one; per-device batch statistics must make them differ "
                       "(are the replicas really seeing only their shards?)")


@pytest.mark.usefixtures("native_cpu_conv")  # exact float32 comparison: see helpers.native_cpu_conv
@pytest.mark.parametrize("n", [2, 3])
@settings(max_examples=5)
@given(data=st.data(), seed=seeds)
def test_batchnorm_in_eval_mode_matches_single_device_on_cpu(n, data, seed):
    # Eval mode normalises with the running statistics, the same on every replica: no per-shard
    # quantity is left, and the gradients agree within float32 tolerance.
    batch_size = data.draw(batch_sizes_for(n, max_batch=12), label="batch_size")
    model = make_model("resnet18", seed).eval()
    X, y = random_batch(batch_size, seed)
    _, replica_grads = manual_gradients(model, X, y, n, "mean")
    expected = reference_gradients(model, X, y, "mean")
    for d, grads in enumerate(replica_grads):
        assert_tensors_close(grads, expected, where=(
            f"BatchNorm in eval mode, batch {batch_size} over {n} devices, seed {seed}: gradient on device {d}"))


@requires_gpus(2)
@pytest.mark.multiprocess
def test_syncbatchnorm_under_ddp_matches_single_device():
    # SyncBatchNorm computes the batch statistics over all ranks' shards, which makes each rank's
    # normalisation that of the whole batch. It refuses CPU tensors, hence the gate.
    seed, batch_size = 3, 12
    model = make_model("resnet18", seed).train()
    X, y = random_batch(batch_size, seed)
    expected = reference_gradients(model, X, y, "mean", device="cuda:0")
    got = spawn(syncbn_gradients_in_rank, (model.state_dict(), X, y), nprocs=2, deadline_s=DDP_DEADLINE_S)
    assert_tensors_close(got, expected, where=f"SyncBatchNorm under DDP on 2 GPUs, batch {batch_size}: rank 0's "
                                              "gradient vs single GPU")
