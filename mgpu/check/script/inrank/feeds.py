"""Inside a rank: what feeds the optimizer's steps, for the causes that need it (docs/guide/check-script.md,
"Causes and the evidence they need"): the order of the data and the learning-rate schedule.

    watch = FeedWatch(); watch.install()    # the Recorder installs one
    watch.loaders()          # (("accelerate.data_loader.BatchSamplerShard", "torch.utils.data.sampler.BatchSampler",
                             #   "torch.utils.data.sampler.RandomSampler"),): each DataLoader iterated so far
    watch.schedulers(opt)    # [{"type": "OneCycleLR", "steps": 2, "length": 90, "by": "accelerate.scheduler"}]
    watch.uninstall()

* **Loaders.** `torch.utils.data.DataLoader.__iter__` is wrapped: each DataLoader the script iterates is
  noted as its sampler chain, outermost first (the batch sampler, the batch sampler it wraps, the
  sampler), each as module.class. The chain says which sampler ordered the data (a RandomSampler, a
  DistributedSampler, accelerate's SeedableRandomSampler) and whether accelerate prepared the loader
  (its BatchSamplerShard at N processes). accelerate's DataLoaderShard iterates a plain DataLoader
  inside, which is what is seen.
* **Schedulers.** `torch.optim.lr_scheduler.LRScheduler.step` is wrapped: each scheduler that steps is
  noted with its optimizer. At each optimizer step, before it, every scheduler of that optimizer is
  recorded: its class, the scheduler steps it has made (`last_epoch`), its length (`total_steps`,
  `T_max`, `total_iters`, `T_0`, `step_size`; None for a schedule without one, LambdaLR's) and the
  module that stepped it (`accelerate.scheduler` for a prepared scheduler, which steps it
  num_processes times an optimizer step by default; `__main__` for the script). A scheduler whose
  class overrides `step` without calling LRScheduler's (ReduceLROnPlateau) is not seen.
"""

from __future__ import annotations

import functools
import sys
import weakref

__all__ = ["FeedWatch", "sampler_chain", "sampler_epoch", "LENGTH_ATTRIBUTES"]

# A scheduler's length, the first of these it has: what a schedule counted per rank or per process changes.
LENGTH_ATTRIBUTES = ("total_steps", "T_max", "total_iters", "T_0", "step_size")
_MOST_LOADERS = 8   # distinct sampler chains kept a rank: a training loader is among the first


def sampler_chain(loader) -> tuple:
    """The loader's samplers, outermost first, as module.class: its batch sampler (or sampler), then
    what each wraps (`batch_sampler`, then `sampler` attributes), at most six deep."""
    chain, seen = [], set()
    obj = getattr(loader, "batch_sampler", None)
    obj = obj if obj is not None else getattr(loader, "sampler", None)
    while obj is not None and id(obj) not in seen and len(chain) < 6:
        seen.add(id(obj))
        chain.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
        inner = getattr(obj, "batch_sampler", None)
        obj = inner if inner is not None else getattr(obj, "sampler", None)
    return tuple(chain)


def _inner(obj):
    """What a loader or sampler wraps: its batch sampler, else its sampler (never truth-tested: a sampler's
    __len__ may raise)."""
    inner = getattr(obj, "batch_sampler", None)
    return inner if inner is not None else getattr(obj, "sampler", None)


def sampler_epoch(loader):
    """The epoch of the first sampler in a loader's chain that has one (DistributedSampler.set_epoch's), else None."""
    obj, seen = _inner(loader), 0
    while obj is not None and seen < 6:
        epoch = getattr(obj, "epoch", None)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            return epoch
        obj, seen = _inner(obj), seen + 1
    return None


def _length(scheduler):
    for name in LENGTH_ATTRIBUTES:
        value = getattr(scheduler, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


class FeedWatch:
    """The DataLoaders a rank iterated and the schedulers that stepped its optimizers (module docstring)."""

    def __init__(self):
        self._loaders: list[tuple] = []
        self._schedulers: list = []          # (weakref to the scheduler, the module that first stepped it)
        self._saved: list = []

    def install(self) -> None:
        from torch.optim import lr_scheduler
        from torch.utils import data

        for owner, name, wrap in ((data.DataLoader, "__iter__", self._iter),
                                  (lr_scheduler.LRScheduler, "step", self._step)):
            original = owner.__dict__[name]
            self._saved.append((owner, name, original))

            def wrapped(obj, *args, _original=original, _wrap=wrap, **kwargs):
                _wrap(obj, sys._getframe(1).f_globals.get("__name__", ""))
                return _original(obj, *args, **kwargs)
            setattr(owner, name, functools.wraps(original)(wrapped))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved = []

    def _iter(self, loader, caller: str) -> None:
        try:
            chain = sampler_chain(loader)
        except Exception:  # a loader that builds its samplers lazily: not this check's business
            return
        if chain not in self._loaders and len(self._loaders) < _MOST_LOADERS:
            self._loaders.append(chain)

    def _step(self, scheduler, caller: str) -> None:
        for i, (ref, by) in enumerate(self._schedulers):
            if ref() is scheduler:
                if by.startswith("torch.") and not caller.startswith("torch."):
                    self._schedulers[i] = (ref, caller)  # the initial step is torch's own; who steps it after
                return
        self._schedulers.append((weakref.ref(scheduler), caller))

    def loaders(self) -> tuple:
        """Each DataLoader iterated so far, as its sampler chain, in order of first iteration."""
        return tuple(self._loaders)

    def schedulers(self, optimizer) -> list[dict]:
        """Every scheduler of this optimizer (or of a wrapper around it, accelerate's) as it stands now."""
        out = []
        for ref, by in self._schedulers:
            s = ref()
            target = getattr(s, "optimizer", None)
            if s is not None and (target is optimizer or getattr(target, "optimizer", None) is optimizer):
                out.append({"type": type(s).__name__, "steps": getattr(s, "last_epoch", None), "length": _length(s),
                            "by": by})
        return out
