"""What a check notices that fails nothing by itself (`--strict` fails it): a `Finding`, named from the
one catalogue both checks share, so that a name means one thing in either report and in the guides.

    Finding(RANDOM_LAYERS, "dropout and stochastic depth switched off in every process ...")
    zero_gradients_finding(grads_per_step, CHECK_SCRIPT_ZERO_WORDS)  # None unless every gradient is zero
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgpu.jsonsafe import finite_or_none

__all__ = ["Finding", "CATALOGUE", "RANDOM_LAYERS", "RANDOMNESS", "BATCH_MIXING", "ZERO_GRADIENTS", "ZeroGradientWords",
           "zero_gradients_finding"]

RANDOM_LAYERS = "random-layers"
RANDOMNESS = "randomness"
BATCH_MIXING = "batch-mixing"
ZERO_GRADIENTS = "zero-gradients"

# Every finding's name, and what it means: `check` (c), `check-script` (s), or both (c, s).
CATALOGUE = {
    RANDOM_LAYERS: "(c, s) dropout or stochastic depth, switched off for the comparison",
    RANDOMNESS: "(c, s) random numbers drawn beyond dropout: parity can then only hold where they do not matter",
    BATCH_MIXING: "(c, s) layers that mix the examples of a batch (BatchNorm without SyncBatchNorm)",
    ZERO_GRADIENTS: "(c, s) every gradient is zero: the comparisons proved nothing (the report is NOT VERIFIED)",
    "unused-parameters": "(c) parameters that get no gradient from some device's shard",
    "forward-buffers": "(c) buffers the forward changes",
    "loss-not-a-sum": "(c) a mean loss: each device's share must be weighted by its examples",
    "same-random-numbers": "(s) every rank drew the same random numbers for its examples",
    "uninitialised-memory": "(s) weights that start from uninitialised memory (torch.empty)",
    "collective-without-autograd": "(s) a torch.distributed collective in the step that autograd does not see",
    "checkpoint-optimizer": "(s) --whole-run: the model's weights saved, never the state of an optimizer that holds some",
}


@dataclass(frozen=True)
class Finding:
    """Something the check noticed about the model or the script that fails nothing by itself
    (`--strict` fails it): its name (`random-layers`, `batch-mixing`, `zero-gradients`, ...), what it
    means and what to do, and the figures behind it where there are some."""

    name: str
    text: str
    errors: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.name not in CATALOGUE:
            raise ValueError(f"finding {self.name!r} is not in mgpu.check.findings.CATALOGUE: add it there, with what it means")

    def __getitem__(self, key: str):
        # check-script's findings were {"name", "text"} dicts: finding["name"] keeps working.
        if key not in ("name", "text"):
            raise KeyError(key)
        return getattr(self, key)

    def to_json(self) -> dict:
        return finite_or_none({"name": self.name, "text": self.text, **({"errors": self.errors} if self.errors else {})})


@dataclass(frozen=True)
class ZeroGradientWords:
    """How a check says where its gradients came from, for the zero-gradients finding."""

    recorded: str     # "of the single-device steps", "world 1 recorded"
    steps: str        # "reference step(s) from the initial weights", "step(s)"
    consequence: str  # "agrees under any strategy, so the comparisons proved nothing"


def zero_gradients_finding(grads_per_step: list[dict], words: ZeroGradientWords) -> Finding | None:
    """The zero-gradients finding when steps were recorded (name -> gradient or None, per step) and every
    gradient is zero or None: a loss that cannot move the weights agrees at any world size, so every
    comparison passes and proves nothing. None otherwise, or when nothing was recorded."""
    if not grads_per_step or not grads_per_step[0]:
        return None
    if any(bool(g.ne(0).any()) for step in grads_per_step for g in step.values() if g is not None):
        return None
    parameters = len(grads_per_step[0])
    return Finding(ZERO_GRADIENTS, (
        f"every gradient {words.recorded} is zero ({len(grads_per_step)} {words.steps}, {parameters} parameter(s)): "
        f"a loss that cannot move the weights {words.consequence} (cross-entropy over a single class, a loss from "
        "detached tensors?); give the check a loss that depends on the weights"))
