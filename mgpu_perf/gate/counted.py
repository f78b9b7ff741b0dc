"""The gate's counted verdict: one step of a benchmark counted in both arms (counts/step.py),
judged exactly (counts/judge.py), beside the timed verdict.

    counted = count_in_both(pools)    # after the warm-up, outside the timing
    counted = judge_counts(answers)   # answers: each arm's workers' "count" answers
    counted.verdict                   # "slower (counted)" | "changed" | "same" | "not counted"
    counted.changes                   # ["+1 allreduce a step (+2.3 MB)", "host reads 1 → 2 a step", ...]

What is guarded, and why a fall is only `changed` here, is counts/judge.py's. What is the gate's own:
the workers of one arm must agree on their counts; a count that two processes of one tree do not
agree on is left out, with that reason, never compared with a tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgpu_perf.counts.judge import NOT_COUNTED, gate_verdict, judge_ranks
from mgpu_perf.gate.arm import ArmError
from mgpu_perf.gate.rounds import Pools, in_both

__all__ = ["Counted", "count_in_both", "judge_counts"]


@dataclass
class Counted:
    verdict: str = NOT_COUNTED
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
    """The counted verdict from each arm's workers' answers to "count" (each: {"counts": [rank dicts]}):
    not counted unless every worker of an arm counted the same; then the arms judged rank by rank."""
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
    judged = judge_ranks(base, cand)
    return Counted(verdict=gate_verdict(judged), changes=judged.changes, guarded=list(judged.increases),
                   counts=per_arm)
