"""Inside a rank: random augmentation keyed to the example, and what the DataLoaders fed each step.

    keyed = KeyedData(sink, on_batch); keyed.install()   # the Recorder's, before the script's first line
    keyed.uninstall(); keyed.evidence()        # {"drawn": {...}, "sites": [...], "fetch_draws": [...], "passes": [...]}

* **Keyed draws.** A map-style dataset's `__getitem__` (its transforms: torchvision's RandomCrop, a numpy
  crop) draws from torch's, numpy's and Python's global generators. At world 1 one process draws for every
  example of a batch in turn; at N ranks each rank (and each DataLoader worker) draws for its own examples:
  the same example gets other random numbers, so world N cannot take world 1's examples. Here
  `torch.utils.data._utils.fetch._MapDatasetFetcher.fetch` (what the DataLoader calls, in its main process
  and in every worker) calls `dataset[index]` once per example with the three generators seeded from
  `example_key(index, epoch)`, and puts the outer states back after the batch: the draws for one example depend on
  (the index, the epoch) only, at every world size, whoever loads it, and the script's other draws
  (collate_fn's, the training step's) are those it makes anyway. `__getitems__` (Subset, random_split)
  is gone around: `dataset[i]` per index, as the fetcher's own fallback does.
* **The epoch** is the sampler's `epoch` (DistributedSampler's `set_epoch`), else how many times the
  loader was iterated. It travels with the indices (`KeyedBatch`, a list with an `mgpu_epoch`), so that a
  persistent worker (`persistent_workers=True`, never re-initialised) keys the epoch it is given. Workers
  started by fork inherit the patched fetcher; spawn or forkserver workers get it from `KeyedWorkerInit`,
  a picklable wrapper of the loader's `worker_init_fn` that calls the script's own after it.
* **Indices.** Each batch's dataset indices are noted when the loader hands the batch over (in order:
  `_next_index` queues them, `__next__` delivers them), so that "the same examples, augmented
  otherwise" is told from "other examples" (a sampler bug) (augment.py).
* **What cannot be keyed** is noted with where it is drawn (`sites`): a draw with an explicit
  `torch.Generator` in `__getitem__`, a generator object the dataset or a transform holds (numpy's
  `default_rng`, `random.Random`), draws in `collate_fn` (MixUp, CutMix), an IterableDataset that draws. The
  first examples a process loads are probed (which global generators `__getitem__` drew from: `drawn`);
  workers report to a file in the run's folder (`sink`), read back at the end.
"""

from __future__ import annotations

import collections
import hashlib
import os
import random
import sys
import threading

import torch

from mgpu.check.script.inrank.draws import held_generators
from mgpu.check.script.inrank.feeds import sampler_epoch

__all__ = ["KeyedData", "KeyedBatch", "KeyedWorkerInit", "example_key", "in_fetch", "note", "PROBES"]

PROBES = 4                  # examples a process checks for draws (and where they are made), then no more
_BASE = 0x6D677075          # "mgpu": the check's own base seed, the same in every run
_MASK = (1 << 64) - 1
_LOCAL = threading.local()
_STATE = {"sink": None, "notes": set(), "probes": PROBES, "installed": False}


def example_key(index, epoch) -> int:
    """A 63-bit seed from (the check's base, the example's dataset index, the epoch): splitmix64."""
    try:
        i = int(index)
    except (TypeError, ValueError):
        i = int.from_bytes(hashlib.sha1(repr(index).encode()).digest()[:8], "little")
    x = (_BASE * 0x9E3779B97F4A7C15 + (i & _MASK) * 0xBF58476D1CE4E5B9 + (int(epoch or 0) + 1) * 0x94D049BB133111EB)
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) >> 1


class KeyedBatch(list):
    """A batch of dataset indices that carries its epoch to the process that fetches it."""

    def __init__(self, indices=(), epoch=None):
        super().__init__(indices)
        self.mgpu_epoch = epoch


class KeyedIndex:
    """One index (a loader with batch_size=None) with its epoch."""

    def __init__(self, index, epoch):
        self.index, self.mgpu_epoch = index, epoch


def in_fetch() -> str:
    """'__getitem__' or 'collate_fn' while this thread fetches a batch, 'loader' in the DataLoader's own
    machinery (its base seed, a RandomSampler's order), else ''."""
    return getattr(_LOCAL, "where", "")


def note(kind: str, text: str) -> None:
    """Note a sighting once a process: in the rank, kept; in a DataLoader worker, appended to the sink."""
    key = (kind, text)
    if key in _STATE["notes"]:
        return
    _STATE["notes"].add(key)
    if torch.utils.data.get_worker_info() is not None and _STATE["sink"]:
        try:
            with open(_STATE["sink"], "a") as f:
                f.write(f"{kind}\t{text}\n")
        except OSError:
            pass


def _numpy():
    return sys.modules.get("numpy")


# Python's and numpy's global generators called directly: random.seed and numpy.random.seed are the
# script's, wrapped to note where it seeds (draws.py).
_RANDOM = random._inst


def _states(np):
    return (torch.default_generator.get_state(), _RANDOM.getstate(),
            np.random.mtrand._rand.get_state() if np else None)


def _set_states(states, np) -> None:
    torch.default_generator.set_state(states[0])
    _RANDOM.setstate(states[1])
    if np is not None and states[2] is not None:
        np.random.mtrand._rand.set_state(states[2])


def _seed(key: int, np) -> None:
    torch.default_generator.manual_seed(key)
    _RANDOM.seed(key)
    if np is not None:
        np.random.mtrand._rand.seed(key & 0xFFFFFFFF)


def _differ(a, b) -> bool:
    if a is None or b is None:
        return False
    if isinstance(a, torch.Tensor):
        return not torch.equal(a, b)
    if isinstance(a, tuple) and len(a) > 1 and hasattr(a[1], "shape"):  # numpy's ('MT19937', keys, pos, ...)
        return a[2] != b[2] or bool((a[1] != b[1]).any())
    return a != b


def _where(obj) -> str:
    while hasattr(obj, "dataset") and hasattr(obj, "indices"):  # a Subset (random_split): the dataset it wraps
        obj = obj.dataset
    code = getattr(getattr(type(obj), "__getitem__", None), "__code__", None)
    return f"{type(obj).__name__}.__getitem__ ({os.path.basename(code.co_filename)}:{code.co_firstlineno})" \
        if code is not None else f"{type(obj).__name__}.__getitem__"


def _item(dataset, index, epoch, np):
    """dataset[index] with the global generators seeded from the example's key (the caller puts the outer
    states back after the batch: seeding each example overwrites them anyway)."""
    _seed(example_key(index, epoch), np)
    probe = _STATE["probes"] > 0
    if probe:
        _STATE["probes"] -= 1
        seeded = _states(np)
    _LOCAL.where = "__getitem__"
    item = dataset[index]
    if probe:
        for name, a, b in zip(("torch", "random", "numpy"), seeded, _states(np)):
            if _differ(a, b):
                note("drawn", f"{name}\t{_where(dataset)}")
    return item


def _keyed_fetch(self, possibly_batched_index):
    epoch = getattr(possibly_batched_index, "mgpu_epoch", None)
    np = _numpy()
    if _STATE.get("first_fetch") is not None and torch.utils.data.get_worker_info() is None:
        _STATE.pop("first_fetch")()  # the script's own states, before keying (draws.DrawWatch.outer_states)
    outer = _states(np)   # once a batch: numpy's get_state and set_state cost more than its seed
    previous = in_fetch()
    try:
        if self.auto_collation:
            data = [_item(self.dataset, i, epoch, np) for i in possibly_batched_index]
        else:
            index = possibly_batched_index.index if isinstance(possibly_batched_index, KeyedIndex) else \
                possibly_batched_index
            data = _item(self.dataset, index, epoch, np)
    finally:
        _LOCAL.where = previous
        _set_states(outer, np)
    probe = "collate" not in _STATE or _STATE["collate"] > 0
    if probe:
        _STATE["collate"] = _STATE.get("collate", 2) - 1
        before = _states(np)
    _LOCAL.where = "collate_fn"
    try:
        return self.collate_fn(data)
    finally:
        _LOCAL.where = previous
        if probe:
            for name, a, b in zip(("torch", "random", "numpy"), before, _states(np)):
                if _differ(a, b):
                    note("site", f"collate\t{name}'s global generator in collate_fn "
                                 f"{getattr(self.collate_fn, '__qualname__', type(self.collate_fn).__name__)}")


class KeyedWorkerInit:
    """A DataLoader's worker_init_fn that keys the worker's fetches (spawn and forkserver workers do not
    inherit the rank's patch), then calls the script's own."""

    def __init__(self, inner, sink):
        self.inner, self.sink = inner, sink

    def __call__(self, worker_id):
        _STATE["sink"] = self.sink
        _STATE["probes"] = PROBES
        _STATE.pop("collate", None)
        _STATE["notes"] = set()
        _STATE.pop("iterable", None)
        _patch_fetcher()
        if self.inner is not None:
            self.inner(worker_id)


_ORIGINALS: dict = {}


def _probed_iterable_fetch(self, possibly_batched_index):
    """An IterableDataset's batch as torch fetches it; its first batches watched for global draws (no index
    to key them by: where they change the data, NOT VERIFIED, augment.py)."""
    original = _ORIGINALS["iterable"]
    if _STATE.get("iterable", 2) <= 0:
        return original(self, possibly_batched_index)
    _STATE["iterable"] = _STATE.get("iterable", 2) - 1
    np = _numpy()
    before = _states(np)
    batch = original(self, possibly_batched_index)
    for name, a, b in zip(("torch", "random", "numpy"), before, _states(np)):
        if _differ(a, b):
            note("site", f"iterable\tan IterableDataset ({type(self.dataset).__name__}) draws from {name}'s global "
                         "generator: its examples have no index to key the draws by")
    return batch


def _patch_fetcher() -> None:
    from torch.utils.data._utils import fetch

    if fetch._MapDatasetFetcher.__dict__["fetch"] is not _keyed_fetch:
        _ORIGINALS.setdefault("fetch", fetch._MapDatasetFetcher.__dict__["fetch"])
        fetch._MapDatasetFetcher.fetch = _keyed_fetch
    if fetch._IterableDatasetFetcher.__dict__["fetch"] is not _probed_iterable_fetch:
        _ORIGINALS.setdefault("iterable", fetch._IterableDatasetFetcher.__dict__["fetch"])
        fetch._IterableDatasetFetcher.fetch = _probed_iterable_fetch


class KeyedData:
    """The patches of the module docstring, and what they saw (`evidence`)."""

    def __init__(self, sink: str | None = None, on_batch=None, first_fetch=None):
        self.sink, self.on_batch, self.first_fetch = sink, on_batch, first_fetch
        self.passes: list = []      # each DataLoader iteration: loader ordinal, epoch, workers, base seed
        self.loaders: dict = {}     # id(loader) -> ordinal
        self.saved: list = []
        self.epoch = None

    def install(self) -> None:
        from torch.utils.data import dataloader

        _STATE.update(sink=self.sink, probes=PROBES, notes=set(), installed=True, first_fetch=self.first_fetch)
        _STATE.pop("collate", None)
        _STATE.pop("iterable", None)
        _patch_fetcher()
        base = dataloader._BaseDataLoaderIter
        for owner, name, wrap in ((dataloader.DataLoader, "__iter__", self._iter), (base, "_next_index", self._next),
                                  (base, "__next__", self._deliver), (base, "_reset", self._reset)):
            original = owner.__dict__[name]
            self.saved.append((owner, name, original))
            setattr(owner, name, wrap(original))

    def uninstall(self) -> None:
        from torch.utils.data._utils import fetch

        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved = []
        if "fetch" in _ORIGINALS:
            fetch._MapDatasetFetcher.fetch = _ORIGINALS.pop("fetch")
        if "iterable" in _ORIGINALS:
            fetch._IterableDatasetFetcher.fetch = _ORIGINALS.pop("iterable")
        _STATE["installed"] = False

    # -- the wrappers --------------------------------------------------------------------------------

    def _iter(self, original):
        keyed = self

        def __iter__(loader):
            passes = loader.__dict__.get("_mgpu_passes", 0)
            loader.__dict__["_mgpu_passes"] = passes + 1
            epoch = sampler_epoch(loader)
            keyed.epoch = passes if epoch is None else epoch
            ordinal = keyed.loaders.setdefault(id(loader), len(keyed.loaders))
            if passes == 0:
                try:
                    keyed._first_sight(loader, ordinal)
                except Exception:  # a dataset that resists being looked at: no sightings, never the script's failure
                    pass
            if loader.__dict__.get("_iterator") is not None:
                loader._iterator._mgpu_epoch = keyed.epoch
            previous, _LOCAL.where = in_fetch(), "loader"
            try:
                it = original(loader)
            finally:
                epoch_now, keyed.epoch, _LOCAL.where = keyed.epoch, None, previous
            it._mgpu_epoch = epoch_now
            if len(keyed.passes) < 64:
                keyed.passes.append({"loader": ordinal, "epoch": epoch_now, "workers": loader.num_workers,
                                     "base_seed": getattr(it, "_base_seed", None)})
            return it
        return __iter__

    def _first_sight(self, loader, ordinal: int) -> None:
        dataset = loader.dataset
        for held in held_generators(dataset, type(dataset).__name__):
            note("site", f"held\t{held}, held by the dataset")
        for held in held_generators(loader.collate_fn, "collate_fn"):
            note("site", f"held\t{held}")
        if loader.num_workers > 0 and not isinstance(loader.__dict__.get("worker_init_fn"), KeyedWorkerInit):
            loader.worker_init_fn = KeyedWorkerInit(loader.worker_init_fn, self.sink)

    def _next(self, original):
        keyed = self

        def _next_index(it):
            index = original(it)
            from torch.utils.data.dataloader import _DatasetKind

            if it._dataset_kind != _DatasetKind.Map:
                return index
            epoch = it.__dict__.get("_mgpu_epoch", keyed.epoch)
            sent = it.__dict__.setdefault("_mgpu_sent", collections.deque())
            if it._auto_collation:
                if isinstance(index, (list, tuple, range, torch.Tensor)) or type(index).__module__ == "numpy":
                    index = KeyedBatch(index, epoch)  # else (a batch of another kind) as it is, keyed at epoch 0
                sent.append([_plain(i) for i in index])
            else:
                sent.append([_plain(index)])
                index = KeyedIndex(index, epoch)
            return index
        return _next_index

    def _deliver(self, original):
        keyed = self

        def __next__(it):
            previous, _LOCAL.where = in_fetch(), "loader"
            try:
                data = original(it)
            finally:
                _LOCAL.where = previous
            sent = it.__dict__.get("_mgpu_sent")
            if sent and keyed.on_batch is not None and getattr(it, "_in_order", True):
                keyed.on_batch(sent.popleft())
            return data
        return __next__

    def _reset(self, original):
        def _reset(it, *args, **kwargs):
            it.__dict__.pop("_mgpu_sent", None)
            return original(it, *args, **kwargs)
        return _reset

    def evidence(self) -> dict:
        """What was seen: which global generators __getitem__ drew from (and where), what cannot be keyed,
        every DataLoader pass. Workers' notes are read from the sink."""
        notes = set(_STATE["notes"])
        if self.sink and os.path.exists(self.sink):
            with open(self.sink) as f:
                notes |= {tuple(line.rstrip("\n").split("\t", 1)) for line in f if "\t" in line}
        drawn: dict = {}
        sites, fetch_draws = [], []
        for kind, text in sorted(notes):
            if kind == "drawn":
                gen, where = text.split("\t", 1)
                drawn.setdefault(gen, where)
            elif kind == "site":
                sites.append(text)
            elif kind == "fetch":
                fetch_draws.append(tuple(text.split("\t")))
        return {"drawn": drawn, "sites": sites, "fetch_draws": fetch_draws, "passes": list(self.passes)}


def _plain(i):
    try:  # an int, a numpy integer, a one-element tensor
        return int(i)
    except (TypeError, ValueError):
        return repr(i)
