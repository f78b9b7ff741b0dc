"""The evidence the causes read beyond one step's tensors: what the judge learned of the script from
every rank's record (findings.findings_of builds it; compare.py and optimizer.py hand it on)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ScriptFacts"]


@dataclass(frozen=True)
class ScriptFacts:
    """What the judge learned of the script from every rank's record that explains a divergence."""

    batchnorm: tuple = ()        # BatchNorm modules normalising per rank (synchronised by the check at world N)
    random_draws: dict = field(default_factory=dict)   # torch function -> draws inside a forward, beyond dropout
    collectives: tuple = ()      # CollectiveCall: a collective without autograd on a tensor that requires grad
    randomness: dict = field(default_factory=dict)     # the script's draws outside the forward (augment.randomness_facts)
