"""Inside a rank: where the script seeds its random generators, where it draws outside the model's forward,
and the state a generator is in when a draw is made (what augment.py compares across ranks).

    draws = DrawWatch(); draws.install()          # the Recorder installs one
    draws.draw("torch.randn_like", args, kwargs, where="step", module=None)   # ScriptMode reports each draw
    draws.state("forward")                        # at the first training forward: torch's state digested
    draws.uninstall(); draws.evidence()           # {"seeds": [...], "step": {...}, "fetch": {...}, "states": {...}}

* **Seeds.** `torch.manual_seed` (and `torch.random.manual_seed`), `random.seed` and `numpy.random.seed`
  are wrapped: each call's value and call site (file:line), the first few of each.
* **Draws** that ScriptMode sees (torch's random functions) are sorted by where they are made: in a
  DataLoader fetch (`__getitem__`: the transform module drawing, else the line; `collate_fn`), in the
  training step (outside any model's forward, after the first batch or forward: noise, nanoGPT's
  `torch.randint` batches; a module without parameters called outside the model: augmentation in the
  step, on the GPU), with an explicit `generator=` (not the global one: not keyable). A site is looked up
  for the first draws only (`SITES`), then the draw is counted.
* **States.** A digest of the generator a draw uses, at the first draw of each kind (`forward`,
  `step`, and of the outer generators at the first main-process fetch): equal on every rank means
  every rank draws the same numbers there.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys

import torch

__all__ = ["DrawWatch", "call_site", "state_digest", "module_generator", "held_generators", "RANDOM_FUNCTIONS"]

# torch's functions that draw random numbers (dropout's are DropoutOff's; these are what it leaves).
RANDOM_FUNCTIONS = {
    torch.rand: "torch.rand", torch.randn: "torch.randn", torch.randint: "torch.randint",
    torch.rand_like: "torch.rand_like", torch.randn_like: "torch.randn_like",
    torch.randint_like: "torch.randint_like", torch.randperm: "torch.randperm", torch.bernoulli: "torch.bernoulli",
    torch.normal: "torch.normal", torch.multinomial: "torch.multinomial", torch.poisson: "torch.poisson",
    torch.Tensor.bernoulli_: "Tensor.bernoulli_", torch.Tensor.normal_: "Tensor.normal_",
    torch.Tensor.uniform_: "Tensor.uniform_", torch.Tensor.random_: "Tensor.random_",
    torch.Tensor.exponential_: "Tensor.exponential_", torch.Tensor.geometric_: "Tensor.geometric_",
    torch.Tensor.cauchy_: "Tensor.cauchy_", torch.Tensor.log_normal_: "Tensor.log_normal_",
    torch.Tensor.multinomial: "Tensor.multinomial", torch.Tensor.bernoulli: "Tensor.bernoulli",
}

SITES = 64      # draws whose site is looked up, a process
_LIBRARIES = (os.sep + "torch" + os.sep, os.sep + "torchvision" + os.sep, os.sep + "numpy" + os.sep,
              os.sep + "mgpu" + os.sep + "scriptcheck" + os.sep, os.sep + "mgpu" + os.sep + "check" + os.sep,
              "<frozen", os.sep + "random.py", os.sep + "runpy.py")


def call_site(depth: int = 2, libraries=_LIBRARIES) -> str:
    """'train.py:42 (get_batch)': the innermost frame outside torch, torchvision, numpy and mgpu."""
    frame = sys._getframe(depth)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(lib in name for lib in libraries):
            return f"{os.path.basename(name)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


def state_digest(generator=None) -> str:
    """A short digest of a torch generator's state (the default CPU generator by default)."""
    g = generator if generator is not None else torch.default_generator
    try:
        state = g.get_state()
    except Exception:
        return ""
    return hashlib.sha1(state.numpy().tobytes()).hexdigest()[:16]


def module_generator(module):
    """The default generator of the device a module's parameters are on (None: the CPU's)."""
    p = next(iter(module.parameters()), None)
    if p is not None and p.is_cuda:
        return torch.cuda.default_generators[p.device.index]
    return None


def _generator_of(args, kwargs):
    g = kwargs.get("generator")
    if g is None:
        g = next((a for a in args if isinstance(a, torch.Generator)), None)
    return g


def _device_generator(args, kwargs):
    """The default generator of the device a draw runs on (CUDA's for a CUDA tensor or device=)."""
    device = kwargs.get("device")
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    dev = torch.device(device) if isinstance(device, (str, torch.device)) else (
        tensor.device if tensor is not None else torch.device("cpu"))
    if dev.type == "cuda":
        try:
            return torch.cuda.default_generators[dev.index if dev.index is not None else torch.cuda.current_device()]
        except Exception:
            return None
    return None


class DrawWatch:
    """Seeding calls, draws outside the forward, generator states (module docstring)."""

    def __init__(self, note=lambda kind, text: None):
        self.note = note                  # keyed.note: a sighting kept, or from a worker sent to the rank
        self.seeds: list = []             # {"generator", "value", "site"}
        self.step: dict = {}              # "torch.randn_like" -> {"calls", "site", "module"}
        self.fetch: dict = {}             # "torch.randint" -> {"calls", "site", "where"}
        self.explicit: dict = {}          # "torch.rand" -> site: a draw with its own generator (in a fetch or step)
        self.states: dict = {}            # "forward" | "step" | "fetch-torch" ... -> digest
        self.sites_left = SITES
        self.saved: list = []

    # -- seeds -----------------------------------------------------------------------------------------

    def install(self) -> None:
        targets = [(torch, "manual_seed", "torch"), (torch.random, "manual_seed", "torch"), (random, "seed", "random")]
        np = sys.modules.get("numpy")
        if np is not None:
            targets.append((np.random, "seed", "numpy"))
        wrapped_by_original: dict = {}
        for owner, name, gen in targets:
            original = getattr(owner, name)
            if id(original) not in wrapped_by_original:
                wrapped_by_original[id(original)] = self._wrap(original, gen)
            self.saved.append((owner, name, original))
            setattr(owner, name, wrapped_by_original[id(original)])

    def uninstall(self) -> None:
        for owner, name, original in reversed(self.saved):
            setattr(owner, name, original)
        self.saved = []

    def _wrap(self, original, gen: str):
        watch = self

        def seed(*args, **kwargs):
            if len(watch.seeds) < 24 and torch.utils.data.get_worker_info() is None:
                value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
                watch.seeds.append({"generator": gen, "value": _short(value), "site": call_site(2)})
            return original(*args, **kwargs)
        seed.__wrapped__ = original
        return seed

    # -- draws -----------------------------------------------------------------------------------------

    def draw(self, name: str, args, kwargs, where: str, module=None) -> None:
        """A torch random function called outside a model's forward: where is '__getitem__', 'collate_fn'
        or 'step'; module: the parameterless module drawing (a transform), if any."""
        kwargs = kwargs or {}
        own = _generator_of(args, kwargs)
        table = self.step if where == "step" else self.fetch
        key = name if where == "step" or module is None else f"{name} in {type(module).__name__}"
        entry = table.get(key)
        if entry is None:
            if self.sites_left <= 0:
                return
            self.sites_left -= 1
            entry = table[key] = {"calls": 0, "site": call_site(3), "where": where, "own": own is not None,
                                   "module": type(module).__name__ if module is not None else ""}
        entry["calls"] += 1
        if own is not None and name not in self.explicit and self.sites_left > 0:
            self.sites_left -= 1
            self.explicit[name] = f"{where} ({entry['module'] or call_site(3)})"
            if where != "step":
                self.note("site", f"generator\t{name}(generator=...) in {where} "
                                   f"({entry['module'] or entry['site']}): a torch.Generator of its own")
        elif where != "step" and entry["calls"] == 1 and _device_generator(args, kwargs) is not None:
            self.note("site", f"generator\t{name} on CUDA in {where} ({entry['module'] or entry['site']}): CUDA's "
                              "generator is not keyed")
        elif where != "step" and entry["calls"] == 1:
            self.note("fetch", f"{name}\t{where}\t{entry['module'] or entry['site']}")
        if where == "step" and own is None and "step" not in self.states:  # the global generator's state
            self.states["step"] = state_digest(_device_generator(args, kwargs))

    def state(self, event: str, generator=None) -> None:
        if event not in self.states:
            self.states[event] = state_digest(generator)

    def outer_states(self) -> None:
        """At the first main-process fetch: the global generators as the script left them (before keying)."""
        if "fetch-torch" in self.states:
            return
        self.states["fetch-torch"] = state_digest()
        self.states["fetch-random"] = hashlib.sha1(repr(random.getstate()).encode()).hexdigest()[:16]
        np = sys.modules.get("numpy")
        if np is not None:
            s = np.random.mtrand._rand.get_state()
            self.states["fetch-numpy"] = hashlib.sha1(s[1].tobytes() + str(s[2]).encode()).hexdigest()[:16]

    def evidence(self) -> dict:
        return {"seeds": list(self.seeds), "step": dict(self.step), "fetch": dict(self.fetch),
                "explicit": dict(self.explicit), "states": dict(self.states)}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


_GENERATOR_TYPES = ("torch.Generator", "numpy.random._generator.Generator", "numpy.random.mtrand.RandomState",
                    "random.Random")


def held_generators(obj, path: str, depth: int = 0, seen=None) -> list[str]:
    """Generator objects a dataset (or its transforms, its wrapped dataset) holds, as 'path (type)'."""
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or depth > 4 or isinstance(obj, (str, bytes, int, float, torch.Tensor)):
        return []
    seen.add(id(obj))
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if kind in _GENERATOR_TYPES:
        return [f"{path} ({type(obj).__module__.split('.')[0]}.{type(obj).__qualname__})"]
    found = []
    if isinstance(obj, (list, tuple)):
        items = list(enumerate(obj))[:32]
        for i, v in items:
            found += held_generators(v, f"{path}[{i}]", depth + 1, seen)
        return found
    if isinstance(obj, dict):
        for k, v in list(obj.items())[:32]:
            found += held_generators(v, f"{path}[{k!r}]", depth + 1, seen)
        return found
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict) and not type(obj).__module__.startswith(("numpy", "builtins")):
        for k, v in list(attrs.items())[:64]:
            if k.startswith("__") or isinstance(v, (str, bytes, int, float, torch.Tensor)):
                continue
            found += held_generators(v, f"{path}.{k}", depth + 1, seen)
    return found
