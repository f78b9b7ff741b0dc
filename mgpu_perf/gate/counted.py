"""The gate's counted verdict: one step of a benchmark counted in both arms (mgpu_perf/counting.py),
compared exactly, beside the timed verdict.

    counted = judge_counts(answers)   # answers: each arm's workers' "count" answers
    counted.verdict                   # "slower (counted)" | "changed" | "same" | "not counted"
    counted.changes                   # ["+1 allreduce a step (+2.3 MB)", "host reads 1 → 2 a step", ...]

A guarded count that grows (host reads, collectives or their bytes, FLOPs, bytes the step's ops
allocate, graph breaks, recompiles) is `slower (counted)`: the step does more than it did, at any
size, so noise cannot hide it. Other differences (op counts alone, a guarded count that fell) are
`changed`, reported and never failed. Counts are compared rank by rank. The workers of one arm
must agree on them; a count that two processes of one tree do not agree on is left out, with that
reason, never compared with a tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgpu_perf.counting import StepCounts, compare_counts
from mgpu_perf.gate.arm import ArmError
from mgpu_perf.gate.rounds import Pools, in_both

__all__ = ["Counted", "count_in_both", "judge_counts", "SLOWER_COUNTED"]

SLOWER_COUNTED = "slower (counted)"


@dataclass
class Counted:
    verdict: str = "not counted"
    changes: list[str] = field(default_factory=list)       # guarded first, each a line
    guarded: list[str] = field(default_factory=list)       # the increases that make it `slower (counted)`
    reason: str = ""                                       # why not counted
    counts: dict = field(default_factory=dict)             # per arm: each rank's counts (StepCounts.to_dict)

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "changes": self.changes, "guarded": self.guarded, "reason": self.reason,
                "counts": self.counts}


def count_in_both(pools: Pools) -> Counted:
    """One step counted in every worker of both arms, after the warm-up and outside the timing. A
    worker that cannot count (its error is the reason) leaves the benchmark not counted, still timed."""
    try:
        return judge_counts(in_both(pools, "count"))
    except ArmError as e:
        return Counted(reason=f"not counted: {e}"[:400])


def judge_counts(answers: dict[str, list[dict]]) -> Counted:
    """The counted verdict from each arm's workers' answers to "count" (each: {"counts": [rank dicts]})."""
    per_arm = {}
    for label, group in answers.items():
        runs = [a.get("counts") for a in group]
        if not runs or any(r is None for r in runs):
            return Counted(reason=f"{label}: a worker did not count its step")
        disagree = [i for i, r in enumerate(runs[1:], 1) if r != runs[0]]
        if disagree:
            return Counted(reason=f"{label}: workers 0 and {disagree[0]} counted different steps "
                                  "(the counts of one tree are not deterministic here)")
        per_arm[label] = runs[0]
    base, cand = per_arm["baseline"], per_arm["candidate"]
    if len(base) != len(cand):
        return Counted(reason=f"ranks: {len(base)} in the baseline, {len(cand)} in the candidate", counts=per_arm)
    changes, guarded, said = [], [], set()
    for rank, (b, c) in enumerate(zip(base, cand)):
        where = f"rank {rank}: " if len(base) > 1 else ""
        for change in compare_counts(StepCounts.from_dict(b), StepCounts.from_dict(c)):
            if change.text in said:
                continue  # the same change in another rank: said once, for the first
            said.add(change.text)
            changes.append(where + change.text)
            if change.slower:
                guarded.append(where + change.text)
    verdict = SLOWER_COUNTED if guarded else ("changed" if changes else "same")
    return Counted(verdict=verdict, changes=sorted(changes, key=lambda x: x not in guarded), guarded=guarded,
                   counts=per_arm)
