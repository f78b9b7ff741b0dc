"""The rounds one benchmark has taken, as its loop (gate/compare.py) fills them: each round's
samples in both arms, and the rounds set aside (`pilot`), outside the estimate.

    rounds = RoundBuffer()
    rounds.add_round(pair, {"baseline": (0.101, 0.102), "candidate": (0.099, 0.100)})
    rounds.set_aside(ops=25)            # a phase ends: its rounds kept, no longer estimated from
    rounds.estimate(threshold=0.10)     # from the rounds since

The one mutable record of the gate's loop: the loop's state (gate/looks.py) holds it, and the
result (gate/comparison.py, frozen) is built from it once the rounds are in. The pilot keeps the
shape ab.json writes: {"ops_per_sample", "ops", "samples", "host_samples", "pairs"}.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgpu_perf.gate import stats as abstats

__all__ = ["ARMS", "RoundBuffer", "by_arm"]

ARMS = ("baseline", "candidate")


def by_arm() -> dict[str, list[float]]:
    """An empty list of times for each arm."""
    return {label: [] for label in ARMS}


@dataclass
class RoundBuffer:
    samples: dict = field(default_factory=by_arm)       # one per round and arm, by the deciding clock
    host_samples: dict = field(default_factory=by_arm)  # host wall time beside
    pairs: list = field(default_factory=list)           # the worker pair of each round
    pilot: dict | None = None                           # rounds set aside (ab.json's shape, above)
    facts: list = field(default_factory=list)           # each round's facts (gate/health.py), where reported

    def add_round(self, pair: int, times: dict, facts: dict | None = None) -> None:
        """One round's samples: {arm: (deciding time, host time)} from its worker pair, and what the
        round health checks (RoundFacts.to_dict), when the round has it."""
        for label, (decided, host) in times.items():
            self.samples[label].append(decided)
            self.host_samples[label].append(host)
        self.pairs.append(pair)
        if facts is not None:
            self.facts.append(facts)

    def set_aside(self, ops: int) -> None:
        """Move the rounds taken so far (of `ops` operations a sample) to the pilot: rounds the sizing
        took as warm-up, or shorter samples than the stretched ones that follow."""
        pilot = self.pilot or {"ops_per_sample": ops, "ops": [], "samples": by_arm(), "host_samples": by_arm(),
                               "pairs": []}
        for key in ("samples", "host_samples"):
            for label in ARMS:
                pilot[key][label] += getattr(self, key)[label]
        pilot["pairs"] += self.pairs
        pilot["ops"] += [ops] * len(self.pairs)
        pilot["facts"] = pilot.get("facts", []) + (self.facts if len(self.facts) == len(self.pairs)
                                                   else [None] * len(self.pairs))
        self.pilot = pilot
        self.samples, self.host_samples, self.pairs, self.facts = by_arm(), by_arm(), [], []

    def take_back(self, ops: int) -> None:
        """Put the rounds set aside that had `ops` operations a sample back among the rounds (before
        them): a refusal look that found `slower` on them all is judged on them all."""
        if not self.pilot:
            return
        keep = [i for i, o in enumerate(self.pilot["ops"]) if o != ops]
        back = [i for i, o in enumerate(self.pilot["ops"]) if o == ops]
        for key in ("samples", "host_samples"):
            for label in ARMS:
                old = self.pilot[key][label]
                getattr(self, key)[label][:0] = [old[i] for i in back]
                self.pilot[key][label] = [old[i] for i in keep]
        self.pairs[:0] = [self.pilot["pairs"][i] for i in back]
        self.pilot["pairs"] = [self.pilot["pairs"][i] for i in keep]
        facts = self.pilot.pop("facts", [None] * len(self.pilot["ops"]))
        if all(facts[i] is not None for i in back) and len(self.facts) + len(back) == len(self.pairs):
            self.facts[:0] = [facts[i] for i in back]
        self.pilot["facts"] = [facts[i] for i in keep]
        self.pilot["ops"] = [self.pilot["ops"][i] for i in keep]
        if not self.pilot["ops"]:
            self.pilot = None

    def set_aside_at(self, ops: int, arm: str) -> list[float]:
        """The samples of `arm` set aside that had `ops` operations a sample (none: [])."""
        if not self.pilot:
            return []
        return [t for t, o in zip(self.pilot["samples"][arm], self.pilot["ops"]) if o == ops]

    def rounds_taken(self) -> int:
        """Every round taken, those set aside included."""
        return len(self.samples["baseline"]) + len(self.pilot["samples"]["baseline"] if self.pilot else [])

    def estimate(self, threshold: float) -> abstats.Estimate:
        """The estimate from the rounds since the last set aside."""
        return abstats.estimate(self.samples["baseline"], self.samples["candidate"], threshold)
