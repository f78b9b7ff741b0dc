"""One benchmark's outcome in the A/B gate: built once, from its loop's state, when its rounds are
in (gate/compare.py), and given its verdict and level by `judge` across the run (a copy: the
record is frozen). What the reports show and ab.json holds (gate/report.py).

    result = compare("test_step[ddp-2]", spec, arms, settings, family_size=7)
    result.estimate.ratio, result.interval(), result.samples["baseline"], result.plans
    results = judge(results, settings)        # the same records, each with its verdict and level
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from mgpu.jsonsafe import finite_or_none
from mgpu_perf.gate import sizing
from mgpu_perf.gate import stats as abstats
from mgpu_perf.gate.loop import by_arm
from mgpu_perf.gate.counted import Counted
from mgpu_perf.gate.health import RoundHealth

__all__ = ["Comparison"]


@dataclass(frozen=True)
class Comparison:
    name: str
    spec: dict
    status: str = "compared"            # compared | not comparable | undecidable (the reason says why)
    reason: str = ""
    ops_per_sample: int = 0
    samples: dict = field(default_factory=by_arm)       # one per round, by `clock` (gate/loop.py)
    host_samples: dict = field(default_factory=by_arm)  # host wall time beside
    pairs: list = field(default_factory=list)  # the worker pair of each round
    clock: str = "host"                 # what decided: host (wall time) | cuda-events (the step's stream)
    clock_reason: str = ""
    graphs: dict = field(default_factory=dict)  # per arm: captured or not, and why not
    plans: list = field(default_factory=list)   # the sizing of each phase (sizing.Plan.to_dict)
    budget_s: float = math.nan          # seconds it was given, set-up included (its share of the run's budget)
    pilot: dict | None = None           # rounds set aside: before a stretch or a second look (not in the estimate)
    seconds: float = 0.0
    round_s: float = math.nan           # seconds a round took (both arms), over every round taken
    count_s: float = 0.0                # seconds the counted step took (both arms at once)
    estimate: abstats.Estimate | None = None
    verdict: str = ""                   # set by judge (compare.py), across the run's benchmarks
    level: float = 0.0                  # the level its verdict was judged at (Holm's, less `spent`)
    counted: Counted = field(default_factory=Counted)  # one step counted in both arms (gate/counted.py)
    spent: float = 0.0                  # level spent on `slower` tests at refusal looks (taken off the final test's)
    early: dict | None = None           # a refusal look whose rounds already showed `slower`: where, at what level
    facts: list = field(default_factory=list)  # each round's facts (gate/health.py RoundFacts.to_dict)
    cpu_applies: bool = False           # the step runs in the workers' processes on the host clock (health rule 4)
    health: RoundHealth | None = None   # what the rounds show beside their ratio, checked by judge

    def median(self, arm: str) -> float:
        return statistics.median(self.samples[arm]) if self.samples[arm] else math.nan

    def interval(self) -> tuple[float, float]:
        return self.estimate.interval(self.level) if self.estimate else (math.nan, math.nan)

    def noise(self) -> float:
        """The rounds' per-round log-ratio noise (sizing.round_noise), nan before two rounds."""
        return sizing.round_noise(self.estimate) if self.estimate else math.nan

    def pair_spread(self) -> float | None:
        logs = [math.log(c / b) for b, c in zip(self.samples["baseline"], self.samples["candidate"])]
        return sizing.pair_spread(logs, self.pairs)

    def to_dict(self) -> dict:
        """For ab.json: strict JSON (no NaN or Infinity: None where a figure does not exist)."""
        return {"name": self.name, "spec": self.spec, "status": self.status, "reason": self.reason,
                "verdict": self.verdict, "rounds": len(self.samples["baseline"]), "ops_per_sample": self.ops_per_sample,
                "baseline_median_s": finite_or_none(self.median("baseline")),
                "candidate_median_s": finite_or_none(self.median("candidate")),
                "ratio": finite_or_none(self.estimate.ratio) if self.estimate else None,
                "interval": finite_or_none(self.interval()),
                "level": self.level, "p_slower": self.estimate.p_slower if self.estimate else None,
                "noise": finite_or_none(self.noise()), "pair_spread": self.pair_spread(), "plans": self.plans,
                "budget_s": finite_or_none(self.budget_s),
                "clock": self.clock, "clock_reason": self.clock_reason, "graphs": self.graphs,
                "seconds": self.seconds, "round_s": finite_or_none(self.round_s), "count_s": self.count_s, "samples": self.samples,
                "host_samples": self.host_samples,
                "pairs": self.pairs, "pilot": self.pilot, "counted": self.counted.to_dict(), "spent": self.spent,
                "early": self.early, "health": self.health.to_dict() if self.health else None,
                "facts": self.facts}
