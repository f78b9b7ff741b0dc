"""Hypothesis strategies shared by the correctness suite: device counts, batch sizes, shapes."""

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
