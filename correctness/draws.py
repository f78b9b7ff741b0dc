"""Hypothesis draws shared by the correctness suite: device counts, batch sizes, shapes, seeds.

(Named draws, not strategies: in this project a strategy is a way of spreading training over
devices, mgpu.strategies.)
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

# Emulated devices are replicas on the CPU: 1..8 is cheap enough for collectives.
device_counts = st.integers(min_value=1, max_value=8)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
float_dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16])
tensor_shapes = st.lists(st.integers(min_value=1, max_value=7), min_size=0, max_size=3).map(tuple)


@st.composite
def batch_and_devices(draw, max_devices: int = 8, max_batch: int = 64):
    """(batch size, device count) with batch >= devices: divisible or not, down to one example a device."""
    n = draw(st.integers(min_value=1, max_value=max_devices))
    b = draw(st.one_of(st.just(n), st.integers(min_value=n, max_value=max(n, max_batch))))
    return b, n


# -- Correctness properties of data-parallel training (issue #4) --------------------------------------------
# Training tests keep to 1..4 emulated devices and small batches: every example runs real models.
multi_device_counts = st.integers(min_value=2, max_value=4)
# Step 1 starts from the seeded weights, step 2 from momentum buffers (and, step by step, a resumed
# checkpoint): every later step takes step 2's path again on another batch, at the same cost each.
training_steps = st.integers(min_value=2, max_value=3)


@st.composite
def multi_batch_and_devices(draw, max_devices: int = 4, max_batch: int = 16):
    """(batch size, device count) with 2 <= devices <= batch: the cases where splitting can go wrong."""
    n = draw(st.integers(min_value=2, max_value=max_devices))
    b = draw(st.one_of(st.just(n), st.integers(min_value=n, max_value=max(n, max_batch))))
    return b, n


@st.composite
def eval_splits(draw, max_devices: int = 4, max_batch: int = 12, max_full_batches: int = 4):
    """(test set size, evaluation batch size, device count); the last batch is often smaller than
    the device count, so that some devices get an empty shard."""
    n = draw(st.integers(min_value=1, max_value=max_devices))
    batch = draw(st.integers(min_value=1, max_value=max_batch))
    full_batches = draw(st.integers(min_value=0, max_value=max_full_batches))
    short_last = st.integers(min_value=1, max_value=max(1, min(batch, n - 1)))
    last = draw(st.one_of(short_last, st.integers(min_value=1, max_value=batch)))
    return full_batches * batch + last, batch, n


def batch_sizes_for(n: int, max_batch: int = 16):
    """Global batch sizes for n devices: n itself (one example a device) or anything up to max_batch."""
    return st.one_of(st.just(n), st.integers(min_value=n, max_value=max(n, max_batch)))
