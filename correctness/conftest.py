"""Fixtures for the whole correctness suite."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """The suite's models and batches are tiny: one intra-op thread is as fast as two, and on a busy
    2-core machine two OpenMP threads that spin-wait for each other slow a step down up to fortyfold.
    Package-wide (undone before perf/ runs), so that module-scoped reference runs and the tests comparing against them bitwise
    use the same thread count (it changes the order of float reductions). DDP ranks choose their
    own (cores / ranks)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def native_cpu_conv():
    """oneDNN (mkldnn), PyTorch's default CPU convolution, picks kernels by batch size, and some
    lose float32 accuracy: a width-4 ResNet-18's first-layer gradient for a batch of 2 comes out
    1e-5 (3e-4 relative) from the float64 value, while for a batch of 1 it is within 1e-9.
    Comparing exact arithmetic then needs wider tolerances than PyTorch's float32 defaults. As with
    TF32 on GPUs, the suite switches the lossy path off rather than widen the tolerance."""
    saved = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = saved
