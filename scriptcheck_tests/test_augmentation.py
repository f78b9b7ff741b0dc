"""Random augmentation keyed to the example (mgpu/check/script/inrank/keyed.py), in one process: the random numbers a
map-style Dataset draws for an example depend on its index and the epoch only, whatever batch, rank or worker
loads it, for torch's, numpy's and Python's global generators; the script's other draws are unchanged; the
indices of each delivered batch are noted; what cannot be keyed is named (augment.py). The loops that run this
through check-script are examples/test_loops_aug.py.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from mgpu.check.script.augment import indices_agree, not_keyed
from mgpu.check.script.causes.randomness import unkeyed_cause
from mgpu.check.script.data import StepData
from mgpu.check.script.inrank.keyed import KeyedBatch, KeyedData, example_key


class Augmented(Dataset):
    """Each example: its index, and one draw from each global generator (an augmentation's parameters)."""

    def __init__(self, n=24, rng=False):
        self.n = n
        self.rng = np.random.default_rng(0) if rng else None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(()).item(), float(np.random.rand()), random.random()])


class Sampled(torch.utils.data.Sampler):
    """Yields a fixed list of indices, with an epoch (as DistributedSampler's set_epoch)."""

    def __init__(self, order):
        self.order, self.epoch = order, 0

    def __iter__(self):
        return iter(self.order)

    def __len__(self):
        return len(self.order)


def _load(dataset, order, batch_size=4, workers=0, epochs=(0,), persistent=False, batches=None):
    """{(epoch, index): drawn values} as a keyed DataLoader delivers them."""
    sampler = Sampled(order)
    keyed = KeyedData(on_batch=batches.append if batches is not None else None)
    keyed.install()
    out = {}
    try:
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                            persistent_workers=persistent)
        for epoch in epochs:
            sampler.epoch = epoch
            for batch in loader:
                for row in batch:
                    out[(epoch, int(row[0]))] = tuple(row[1:].tolist())
    finally:
        keyed.uninstall()
    return out


def test_an_example_draws_alike_in_any_batch_and_any_order_and_otherwise_in_another_epoch():
    one = _load(Augmented(), list(range(24)), batch_size=8, epochs=(0, 1))
    shard = _load(Augmented(), list(range(1, 24, 2)) + list(range(0, 24, 2)), batch_size=3, epochs=(0, 1))
    assert one == shard
    assert one[(0, 5)] != one[(1, 5)], "another epoch draws another augmentation"
    assert len({v for v in one.values()}) == len(one), "each example its own draws"


def test_the_script_s_own_draws_are_unchanged_and_the_indices_noted():
    """The script's draws outside __getitem__ (the DataLoader's base seed, the step's) are those it makes
    with a dataset that draws nothing."""
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    for _ in DataLoader(list(range(10)), batch_size=2, sampler=Sampled([4, 2, 9, 7, 1])):
        pass
    expected = (torch.rand(2).tolist(), random.random(), float(np.random.rand()))
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    batches = []
    _load(Augmented(), [4, 2, 9, 7, 1], batch_size=2, batches=batches)
    assert (torch.rand(2).tolist(), random.random(), float(np.random.rand())) == expected
    assert batches == [[4, 2], [9, 7], [1]], batches


def test_a_subset_is_keyed_by_its_own_index():
    data = Subset(Augmented(40), list(range(10, 34)))
    a = _load(data, list(range(24)), batch_size=6)
    b = _load(data, list(reversed(range(24))), batch_size=5)
    assert a == b


@pytest.mark.timeout(120)
def test_workers_key_alike_and_persistent_workers_get_the_epoch():
    one = _load(Augmented(), list(range(24)), batch_size=4, epochs=(0, 1))
    workers = _load(Augmented(), list(range(24)), batch_size=4, workers=2, epochs=(0, 1), persistent=True)
    assert workers == one


def test_the_key_depends_on_index_and_epoch_only():
    assert example_key(3, 0) == example_key(3, 0) == example_key(np.int64(3), 0)
    assert len({example_key(i, e) for i in range(50) for e in range(3)}) == 150
    assert 0 <= example_key("a/key", 2) < 2 ** 63
    batch = KeyedBatch([1, 2], 5)
    import pickle

    again = pickle.loads(pickle.dumps(batch))
    assert again == [1, 2] and again.mgpu_epoch == 5


def test_indices_tell_a_sampler_bug_from_draws_the_check_cannot_key():
    facts = {"sites": ["collate\ttorch's global generator in collate_fn mixup"], "step": {}}
    same = StepData(["a"], [["b"], ["c"]], 1, [1, 1], indices_1=[[1, 2]], indices_n=[[[2]], [[1]]])
    other = StepData(["a"], [["b"], ["c"]], 1, [1, 1], indices_1=[[1, 2]], indices_n=[[[3]], [[1]]])
    assert indices_agree(same) is True and indices_agree(other) is False
    why, explained = unkeyed_cause(same, 2, facts, "")
    assert explained and "collate_fn mixup" in why and "the same examples" in why, why
    why, explained = unkeyed_cause(other, 2, facts, "")
    assert not explained and "other dataset indices" in why and "1 of 2 shared" in why, why
    nanogpt = {"sites": [], "step": {"torch.randint": {"calls": 4, "site": "train.py:120 (get_batch)", "module": ""}}}
    why, explained = unkeyed_cause(StepData(["a"], [["b"]], 1, [1]), 2, nanogpt, "")
    assert explained and "drawn at random in the training step" in why and "train.py:120" in why, why
    assert not_keyed({"sites": ["held\tDs.rng (numpy.Generator), held by the dataset"], "step": {}})


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(8):
            yield torch.tensor([float(i), torch.rand(()).item()])


def test_an_iterable_dataset_that_draws_is_named_not_keyed():
    keyed = KeyedData()
    keyed.install()
    try:
        for _ in DataLoader(Stream(), batch_size=4):
            pass
        sites = keyed.evidence()["sites"]
    finally:
        keyed.uninstall()
    assert any(s.startswith("iterable\tan IterableDataset (Stream) draws from torch's") for s in sites), sites
    why, explained = unkeyed_cause(StepData(["a"], [["b"]], 1, [1]), 2, {"sites": sites, "step": {}}, "")
    assert explained and "no index to key the draws by" in why, why
