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
