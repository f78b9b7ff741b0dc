"""Batch scatter and allreduce: properties over batch sizes, device counts, shapes and dtypes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from correctness.draws import batch_and_devices, device_counts, float_dtypes, seeds, tensor_shapes
from mgpu.comm import allreduce, ring_allreduce, shard_sizes, split_batch
from mgpu.devices import devices
from mgpu.errors import ConfigError, ShapeError


# -- split_batch ---------------------------------------------------------------------------------

@given(batch_and_devices(), seeds)
def test_split_batch_shards_concatenate_back_in_order(bn, seed):
    b, n = bn
    g = torch.Generator().manual_seed(seed)
    X, y = torch.rand(b, 1, 4, 4, generator=g), torch.arange(b)
    Xs, ys = split_batch(X, y, devices(n))
    assert len(Xs) == len(ys) == n, f"{n} devices must give {n} shards, got {len(Xs)}"
    # .cpu(): beside GPUs devices(n) puts the shards on them
    assert torch.equal(torch.cat([s.cpu() for s in Xs]), X) and torch.equal(torch.cat([s.cpu() for s in ys]), y), \
        f"shards of B={b} over n={n} lost order"
    sizes = [s.shape[0] for s in Xs]
    assert max(sizes) - min(sizes) <= 1, f"shard sizes {sizes} differ by more than one"
    assert min(sizes) >= 1, f"an empty shard in {sizes} although B={b} >= n={n}"
    assert [s.shape[0] for s in ys] == sizes, "X and y shards have different sizes"


@given(batch_and_devices())
def test_shard_sizes_put_the_larger_shards_first(bn):
    b, n = bn
    sizes = shard_sizes(b, n)
    assert sum(sizes) == b and sizes == sorted(sizes, reverse=True), f"shard_sizes({b}, {n}) = {sizes}"


def test_split_batch_puts_each_shard_on_its_device():
    # A device list that mixes `meta` and the CPU, so that a shard left on the input's device, or
    # every shard sent to the first device, shows on a machine without GPUs too.
    devs = [torch.device("meta"), torch.device("cpu"), torch.device("meta")]
    X, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    Xs, ys = split_batch(X, y, devs)
    assert [x.device for x in Xs] == devs, f"X shards on {[x.device for x in Xs]}, devices {devs}"
    assert [t.device for t in ys] == devs, f"y shards on {[t.device for t in ys]}, devices {devs}"
    assert [s.shape[0] for s in Xs] == [2, 2, 1] and [s.shape[0] for s in ys] == [2, 2, 1]
    assert torch.equal(Xs[1], X[2:4]) and torch.equal(ys[1], y[2:4]), "the CPU shard is not the batch's middle part"


def test_split_batch_rejects_mismatched_lengths():
    with pytest.raises(ShapeError, match="X has 4 examples but y has 3"):
        split_batch(torch.zeros(4, 2), torch.zeros(3), devices(2))


def test_split_batch_rejects_a_batch_smaller_than_the_device_count():
    with pytest.raises(ConfigError, match="batch of 2 examples is smaller than the 3 devices"):
        split_batch(torch.zeros(2, 2), torch.zeros(2), devices(3))


@pytest.mark.parametrize("devs", [[], None])
def test_split_batch_rejects_no_devices(devs):
    with pytest.raises(ConfigError, match="no devices given"):
        split_batch(torch.zeros(2, 2), torch.zeros(2), devs)


# -- allreduce -----------------------------------------------------------------------------------

def _draw_tensors(n: int, shape: tuple, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(n)]


def _assert_is_the_sum(results: list[torch.Tensor], inputs: list[torch.Tensor], what: str) -> None:
    """Every result bitwise equal to the first, and the first within a rounding bound of the exact sum."""
    for i, r in enumerate(results[1:], start=1):
        assert torch.equal(r, results[0]), f"{what}: device {i} holds different values than device 0"
    exact = torch.stack([t.double() for t in inputs]).sum(0)
    magnitude = torch.stack([t.double().abs() for t in inputs]).sum(0)
    eps = torch.finfo(inputs[0].dtype).eps
    # n additions, each rounding by at most eps relative to its partial sum, plus the final cast.
    bound = len(inputs) * eps * magnitude + torch.finfo(inputs[0].dtype).tiny
    err = (results[0].double() - exact).abs()
    assert bool((err <= bound).all()), (f"{what}: off the exact sum by up to {err.max().item():.3g} "
                                        f"(bound {bound.max().item():.3g}) for {len(inputs)} {inputs[0].dtype} tensors")


@pytest.mark.parametrize("algorithm", [allreduce, ring_allreduce], ids=["allreduce", "ring_allreduce"])
@given(n=device_counts, shape=tensor_shapes, dtype=float_dtypes, seed=seeds)
def test_allreduce_leaves_the_sum_on_every_device(algorithm, n, shape, dtype, seed):
    inputs = _draw_tensors(n, shape, dtype, seed)
    tensors = [t.clone() for t in inputs]
    algorithm(tensors)
    _assert_is_the_sum(tensors, inputs, f"{algorithm.__name__} over {n} devices, shape {shape}")


@given(n=device_counts, shape=tensor_shapes, dtype=float_dtypes, seed=seeds)
def test_naive_and_ring_allreduce_agree(n, shape, dtype, seed):
    inputs = _draw_tensors(n, shape, dtype, seed)
    naive, ring = [t.clone() for t in inputs], [t.clone() for t in inputs]
    allreduce(naive)
    ring_allreduce(ring)
    # Different summation orders: equal within the rounding of n additions, not bitwise.
    eps = torch.finfo(dtype).eps
    bound = 2 * n * eps * torch.stack([t.double().abs() for t in inputs]).sum(0) + torch.finfo(dtype).tiny
    diff = (naive[0].double() - ring[0].double()).abs()
    assert bool((diff <= bound).all()), f"naive and ring allreduce differ by {diff.max().item():.3g} for n={n}, {dtype}"


def test_ring_allreduce_handles_non_contiguous_tensors():
    inputs = [torch.arange(12.0).reshape(3, 4).t() * (i + 1) for i in range(3)]  # transposed views
    tensors = [t.clone().t().contiguous().t() for t in inputs]
    assert not tensors[0].is_contiguous()
    ring_allreduce(tensors)
    torch.testing.assert_close(tensors[2], inputs[0] * 6, msg="non-contiguous ring allreduce lost the sum")


@pytest.mark.parametrize("algorithm", [allreduce, ring_allreduce])
def test_allreduce_rejects_mismatched_shapes_and_dtypes(algorithm):
    with pytest.raises(ShapeError, match=r"tensor 1 is \(3,\)"):
        algorithm([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(ShapeError, match="torch.float64"):
        algorithm([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])
    with pytest.raises(ConfigError, match="at least one tensor"):
        algorithm([])


# -- agreement with torch.distributed on a gloo group ------------------------------------------------

def _gloo_all_reduce(seed: int):
    """Runs in each of two ranks: all_reduce one tensor per dtype with gloo."""
    import os

    import torch.distributed as dist

    from mgpu.strategies.ddp import setup_process_group

    setup_process_group("gloo", timeout_s=30)
    rank = int(os.environ["RANK"])
    out = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        t = _draw_tensors(2, (5, 7), dtype, seed)[rank]
        dist.all_reduce(t)
        out[str(dtype)] = t
    dist.destroy_process_group()
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_both_allreduces_agree_with_torch_distributed_gloo():
    from mgpu.launch import spawn

    seed = 1234
    gloo = spawn(_gloo_all_reduce, seed, nprocs=2, deadline_s=60)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        inputs = _draw_tensors(2, (5, 7), dtype, seed)
        for algorithm in (allreduce, ring_allreduce):
            tensors = [t.clone() for t in inputs]
            algorithm(tensors)
            # With two addends every order gives the same correctly rounded sum: bitwise equal.
            assert torch.equal(tensors[0], gloo[str(dtype)]), \
                f"{algorithm.__name__} and gloo all_reduce differ for {dtype}: " \
                f"max diff {(tensors[0].double() - gloo[str(dtype)].double()).abs().max().item():.3g}"
