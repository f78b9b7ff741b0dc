"""Inside a rank, under `mgpu check-script --whole-run`: each DataLoader pass (one `iter(loader)`), which
of them feed optimizer steps (training epochs), and the lazy cut that ends a training epoch after K steps.

    watch = EpochWatch(epoch_steps=4, batches=recorder.batches); watch.install()   # the Recorder's
    epoch = watch.stepped()     # at each optimizer step of the first optimizer: the epoch that fed it
    watch.passes                # [EpochPass(loader=0, made_at="train.py:40", epoch=1, steps=4, cut=True, ...)]
    watch.uninstall()

**Training or evaluation.** A pass is a training pass when it fed an optimizer step: at each step of
the first optimizer, the pass that delivered the last batch since the previous step with grad mode on
(else the last pass that delivered one; else the last training pass) fed it. An evaluation pass
(under `no_grad`, or a full pass between two steps) never has a step between its batches, so it is
never a training pass and never cut. Training passes are numbered in order: they are the epochs.

**The cut.** Once a training pass has fed `epoch_steps` optimizer steps, its next batch is not
fetched: `__next__` raises StopIteration, and the loop ends as at the end of its data (a `for` loop,
`enumerate`, tqdm, accelerate's prepared loader). A script that takes batches itself with `next(it)`
(a step-based loop) is not cut: it runs to its own step count. Told apart by the caller of
`__next__`: a FOR_ITER instruction, or library code, is a loop; a `next()` in the script's own code is not.

**What each pass keeps** (`EpochPass`): where its DataLoader was made (file:line, wrapping
`DataLoader.__init__`), its sampler and whether it shuffles, the sampler's indices in order (the
first MOST_INDICES: a training pass holds at most K steps' worth), batches, steps fed, cut or
exhausted. The judge compares epoch 2's order with epoch 1's, and the ranks' shards (causes/epochs.py).
"""

from __future__ import annotations

import dis
import functools
import os
import sys
import sysconfig

import torch

from mgpu.check.script.inrank.records import EpochPass

__all__ = ["EpochWatch", "shuffling", "made_at", "MOST_PASSES", "MOST_INDICES"]

MOST_PASSES = 256        # passes kept a rank (a long run's memory stays bounded)
MOST_INDICES = 1 << 16   # sampler indices kept a pass
_FOR_ITER = dis.opmap["FOR_ITER"]
_LIBRARIES = tuple(os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()[k] for k in ("stdlib", "purelib",
                                                                                              "platlib")})
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_MGPU = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep


def _library(path: str) -> bool:
    path = os.path.abspath(path)
    return path.startswith(_LIBRARIES) or path.startswith(_TORCH) or path.startswith(_MGPU) or path.startswith("<")


def made_at(frame, through_libraries: bool = False) -> str:
    """The first frame outside torch and mgpu, as file:line (relative to the working folder when inside it); with
    `through_libraries`, where that frame is a library's (accelerate's prepare), the script's line that led there
    too: "data_loader.py:441 (from train.py:40)"."""
    while frame is not None and (frame.f_code.co_filename.startswith(_TORCH) or
                                 frame.f_code.co_filename.startswith(_MGPU)):
        frame = frame.f_back
    if frame is None:
        return "?"
    where = _file_line(frame)
    if through_libraries and _library(frame.f_code.co_filename):
        outer = frame
        while outer is not None and _library(outer.f_code.co_filename):
            outer = outer.f_back
        if outer is not None:
            where += f" (from {_file_line(outer)})"
    return where


def _file_line(frame) -> str:
    path = frame.f_code.co_filename
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{os.path.basename(path) if rel.startswith('..') else rel}:{frame.f_lineno}"


def shuffling(loader) -> tuple[str, bool | None]:
    """The loader's sampler (the innermost of its chain) and whether it shuffles: True for a RandomSampler,
    SubsetRandomSampler or a sampler with `shuffle` set (DistributedSampler), False for one with `shuffle`
    unset or a SequentialSampler, None when it cannot be told (a sampler of the script's own)."""
    from torch.utils.data import RandomSampler, SequentialSampler, SubsetRandomSampler

    obj, found, seen = loader, None, 0
    while obj is not None and seen < 6:
        inner = getattr(obj, "batch_sampler", None)
        inner = inner if inner is not None else getattr(obj, "sampler", None)
        if inner is None or inner is obj:
            break
        obj, seen = inner, seen + 1
        if isinstance(obj, (RandomSampler, SubsetRandomSampler)):
            return type(obj).__name__, True
        if isinstance(getattr(obj, "shuffle", None), bool):
            found = (type(obj).__name__, obj.shuffle)
        elif isinstance(obj, SequentialSampler):
            return type(obj).__name__, False
    return found if found is not None else (type(obj).__name__ if obj is not None else "", None)


class EpochWatch:
    """The module docstring's passes and cut; `epoch_steps` 0 records the passes without cutting."""

    def __init__(self, epoch_steps: int, batches: list, clock=None, digest=None):
        self.k = epoch_steps
        self.clock = clock               # () -> the rank's event clock (evaluation.py), None: not kept
        self.digest = digest             # batch -> a digest per example (evaluation.py), None: not kept
        self.batches = batches           # the Recorder's: each delivered batch's dataset indices (keyed.py)
        self.passes: list[EpochPass] = []
        self.epochs = 0                  # training passes so far
        self.since: list = []            # (pass, grad on) delivered since the last step
        self.last_training: EpochPass | None = None
        self.saved: list = []
        self.loaders: dict = {}          # id(loader) -> ordinal
        self.switches: list = []         # (clock, index in passes) where another pass began to deliver batches

    def install(self) -> None:
        from torch.utils.data import dataloader

        base = dataloader._BaseDataLoaderIter
        for owner, name, wrap in ((dataloader.DataLoader, "__init__", self._init),
                                  (dataloader.DataLoader, "__iter__", self._iter), (base, "__next__", self._next)):
            original = owner.__dict__[name]
            self.saved.append((owner, name, original))
            setattr(owner, name, functools.wraps(original)(wrap(original)))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved = []

    # -- the wrappers --------------------------------------------------------------------------------

    def _init(self, original):
        def __init__(loader, *args, **kwargs):
            original(loader, *args, **kwargs)
            loader.__dict__["_mgpu_made_at"] = made_at(sys._getframe(1), through_libraries=True)
        return __init__

    def _iter(self, original):
        watch = self

        def __iter__(loader):
            it = original(loader)
            try:
                it.__dict__["_mgpu_pass"] = watch._new_pass(loader)
            except Exception:  # an iterator without a __dict__ or a loader that resists: not watched
                pass
            return it
        return __iter__

    def _next(self, original):
        watch = self

        def __next__(it):
            p = it.__dict__.get("_mgpu_pass")
            if p is None:
                return original(it)
            if watch.k and p.epoch is not None and p.steps >= watch.k and _a_loop(sys._getframe(1)):
                p.cut = True
                raise StopIteration
            before = len(watch.batches)
            try:
                data = original(it)
            except StopIteration:
                p.exhausted = True
                raise
            p.batches += 1
            watch._evaluation_evidence(p, data)
            if len(watch.batches) > before and len(p.indices) < MOST_INDICES:
                p.indices.extend(_through_subsets(getattr(it, "_dataset", None),
                                                  watch.batches[-1][:MOST_INDICES - len(p.indices)]))
            watch.since.append((p, torch.is_grad_enabled()))
            return data
        return __next__

    def _evaluation_evidence(self, p: EpochPass, data) -> None:
        """The pass's place on the event clock, grad mode, and (while it has fed no step) its examples' digests."""
        if self.clock is not None:
            p.ended = self.clock()
            p.started = p.started or p.ended
            if (not self.switches or self.passes[self.switches[-1][1]] is not p) and len(self.switches) < MOST_INDICES:
                # another pass fetches now: its place in the passes, for the judge's "which pass came last"
                self.switches.append((p.ended, next(i for i in range(len(self.passes) - 1, -1, -1)
                                                    if self.passes[i] is p)))
        p.no_grad = (p.batches == 1 or p.no_grad) and not torch.is_grad_enabled()
        if self.digest is not None and p.epoch is None and len(p.digests) < MOST_INDICES:
            p.digests.extend(self.digest(data))

    def _new_pass(self, loader) -> EpochPass | None:
        ordinal = self.loaders.setdefault(id(loader), len(self.loaders))
        number = sum(1 for p in self.passes if p.loader == ordinal) + 1
        if len(self.passes) >= MOST_PASSES:
            return None
        sampler, shuffles = shuffling(loader)
        p = EpochPass(loader=ordinal, made_at=loader.__dict__.get("_mgpu_made_at", "?"), sampler=sampler,
                      shuffles=shuffles, number=number)
        try:
            p.dataset_size = len(loader.dataset)
        except Exception:  # an IterableDataset without a length
            pass
        self.passes.append(p)
        return p

    # -- at a step -----------------------------------------------------------------------------------

    def stepped(self) -> int | None:
        """An optimizer step of the first optimizer was made: the pass that fed it (the module docstring's
        rule) counts it; its epoch (1-based), or None where no DataLoader fed the step (get_batch)."""
        fed = next((p for p, grad in reversed(self.since) if grad), None) or \
            (self.since[-1][0] if self.since else self.last_training)
        self.since = []
        if fed is None:
            return None
        if fed.epoch is None:
            self.epochs += 1
            fed.epoch, fed.digests = self.epochs, []   # a training pass: no evaluation's digests
        fed.steps += 1
        self.last_training = fed
        return fed.epoch

    def current(self) -> int | None:
        return self.last_training.epoch if self.last_training is not None else None


def _through_subsets(dataset, indices: list) -> list:
    """A Subset's indices as the indices of the dataset under it (nested Subsets followed): per-rank Subsets of
    one dataset then name each example alike at every world size."""
    from torch.utils.data import Subset

    if not isinstance(dataset, Subset):
        return indices
    out = []
    for i in indices:
        ds = dataset
        try:
            while isinstance(ds, Subset) and isinstance(i, int):
                i, ds = int(ds.indices[i]), ds.dataset
        except (IndexError, TypeError, ValueError):
            pass
        out.append(i)
    return out


def _a_loop(frame) -> bool:
    """The caller of a loader iterator's __next__ is a loop (a FOR_ITER instruction) or library code (tqdm,
    accelerate: their own loops); False for a `next(it)` in the script's own code."""
    if frame is None:
        return True
    try:
        if frame.f_code.co_code[frame.f_lasti] == _FOR_ITER:
            return True
    except (IndexError, AttributeError):
        return True
    return _library(frame.f_code.co_filename)
