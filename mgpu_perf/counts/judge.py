"""Two counts of a step judged: what changed between them, rank by rank, and the verdict's name.

    changes = compare_counts(base, cand)        # one rank's StepCounts: every difference, guarded first
    judged = judge_ranks(base_ranks, cand_ranks)  # each rank's counts (StepCounts.to_dict), compared once
    gate_verdict(judged)                        # the A/B gate's: "slower (counted)" | "changed" | "same"
    ratchet_verdict(judged)                     # the counted baseline's: also "fewer (counted)"

Guarded counts are the ones a step cannot do more of without doing more work at any size, so noise
cannot hide an increase: host reads, collectives and their bytes, storages taken by Python, FLOPs,
bytes allocated and written, graph breaks, recompiles. An increase of one is `slower (counted)`.
Op counts, CUDA kernels and peak memory are reported, never failed: an op count follows views and
metadata ops, a kernel count cuBLAS's and cuDNN's choices, a peak the allocator's history.

The two users differ only in what a guarded count that fell means. The gate compares two trees,
neither the reference: a fall is `changed`, reported. The counted baseline (counts/baseline.py)
keeps the best the code has done: a fall is `fewer (counted)`, a failure until the file is updated.
The verdict names are the constants below, for every module that writes or reads one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mgpu_perf.counts.step import StepCounts, readable_size

__all__ = ["SAME", "CHANGED", "SLOWER_COUNTED", "FEWER_COUNTED", "NOT_COUNTED", "NOT_COMPARABLE", "NO_ENTRY",
           "FAILING", "CountChange", "compare_counts", "Judged", "judge_ranks", "gate_verdict", "ratchet_verdict"]

SAME = "same"
CHANGED = "changed"                     # only reported differences (and, in the gate, guarded falls)
SLOWER_COUNTED = "slower (counted)"     # a guarded count grew: a failure in the gate and the baseline check
FEWER_COUNTED = "fewer (counted)"       # a guarded count fell: the baseline check's ratchet, a failure
NOT_COUNTED = "not counted"             # the gate: a worker could not count, or its arm's workers disagree
NOT_COMPARABLE = "not comparable"       # the baseline check: recorded under another environment, or rank count
NO_ENTRY = "no entry"                   # the baseline check: the file has no entry of the workload
FAILING = (SLOWER_COUNTED, FEWER_COUNTED)  # the verdicts that fail a test whatever the options


@dataclass(frozen=True)
class CountChange:
    what: str        # "host_reads", "collective:allreduce_", "op:aten.copy_", "flops", ...
    baseline: Any
    candidate: Any
    guarded: bool    # an increase here is `slower (counted)`
    text: str

    @property
    def slower(self) -> bool:
        return self.guarded and _more(self.candidate, self.baseline)


def _more(a, b) -> bool:
    return (a or 0) > (b or 0)


def _pct(a: float, b: float) -> str:
    return f"{(b - a) / a * 100:+.1f} %" if a else "new"


def compare_counts(base: StepCounts, cand: StepCounts) -> list[CountChange]:
    """Every difference between two steps' counts, guarded ones first; empty when they agree. Guarded
    (an increase is `slower (counted)`): host reads, collectives and their bytes, storages taken,
    FLOPs, bytes allocated and written, graph breaks, recompiles; the rest are reported."""
    changes = []
    if base.host_reads != cand.host_reads:
        changes.append(CountChange("host_reads", base.host_reads, cand.host_reads, True,
                                   f"host reads {base.host_reads} → {cand.host_reads} a step"))
    for kind in sorted(set(base.collectives) | set(cand.collectives)):
        b = base.collectives.get(kind, {"count": 0, "bytes": 0})
        c = cand.collectives.get(kind, {"count": 0, "bytes": 0})
        if b != c:
            delta = c["count"] - b["count"]
            changes.append(CountChange(f"collective:{kind}", (b["count"], b["bytes"]), (c["count"], c["bytes"]), True,
                                       f"{delta:+d} {kind.rstrip('_')} a step ({'+' if c['bytes'] >= b['bytes'] else '-'}"
                                       f"{readable_size(abs(c['bytes'] - b['bytes']))})" if delta else
                                       f"{kind.rstrip('_')} bytes {readable_size(b['bytes'])} → "
                                       f"{readable_size(c['bytes'])} a step"))
    if base.storage_reads != cand.storage_reads:
        changes.append(CountChange("storage_reads", base.storage_reads, cand.storage_reads, True,
                                   f"tensor storages taken by Python (torch.save, pickling) {base.storage_reads} → "
                                   f"{cand.storage_reads} a step"))
    if base.flops != cand.flops:
        changes.append(CountChange("flops", base.flops, cand.flops, True, f"FLOPs {_pct(base.flops, cand.flops)}"))
    for what, label in (("allocated_bytes", "bytes allocated by the step's ops"),
                        ("written_bytes", "bytes written in place by the step's ops")):
        b, c = getattr(base, what), getattr(cand, what)
        if b != c:
            changes.append(CountChange(what, b, c, True,
                                       f"{label} {'+' if c > b else '-'}{readable_size(abs(c - b))} a step "
                                       f"({readable_size(b)} → {readable_size(c)}, {_pct(b, c)})"))
    if base.graph_breaks != cand.graph_breaks:
        reasons = sorted(set((cand.compile or {}).get("graph_breaks", {})) - set((base.compile or {}).get("graph_breaks", {})))
        changes.append(CountChange("graph_breaks", base.graph_breaks, cand.graph_breaks, True,
                                   f"graph breaks {base.graph_breaks} → {cand.graph_breaks}"
                                   + (f" ({reasons[0]})" if reasons else "")))
    if base.recompiles != cand.recompiles:
        changes.append(CountChange("recompiles", base.recompiles, cand.recompiles, True,
                                   f"graphs compiled during a warm step {base.recompiles} → {cand.recompiles}"))
    if base.kernels != cand.kernels:
        changes.append(CountChange("kernels", base.kernels, cand.kernels, False,
                                   f"CUDA kernels {base.kernels} → {cand.kernels} a step"))
    b_peak, c_peak = (base.cuda or {}).get("peak_bytes"), (cand.cuda or {}).get("peak_bytes")
    if b_peak is not None and c_peak is not None and b_peak != c_peak:
        changes.append(CountChange("peak_bytes", b_peak, c_peak, False,
                                   f"peak memory {readable_size(b_peak)} → {readable_size(c_peak)} ({_pct(b_peak, c_peak)})"))
    for op in sorted(set(base.ops) | set(cand.ops)):
        b, c = base.ops.get(op, 0), cand.ops.get(op, 0)
        if b != c:
            changes.append(CountChange(f"op:{op}", b, c, False, f"{op.replace('aten.', 'aten::')} {b} → {c}"))
    return changes


@dataclass(frozen=True)
class Judged:
    """What changed between two counted steps, each a line (`rank 1: host reads 1 → 2 a step`)."""
    increases: tuple[str, ...] = ()  # guarded counts that grew: `slower (counted)`
    decreases: tuple[str, ...] = ()  # guarded counts that fell
    reported: tuple[str, ...] = ()   # op counts, CUDA kernels, peak memory: never failed

    @property
    def changes(self) -> list[str]:
        """Every line, the increases first, then the other guarded changes, then the reported ones."""
        return [*self.increases, *self.decreases, *self.reported]


def judge_ranks(base: list[dict], cand: list[dict]) -> Judged:
    """Each rank's counts (StepCounts.to_dict, in rank order) against the same rank's, both lists of
    one length (ValueError otherwise: the callers say why the rank counts differ in their own words).
    A line says its rank where there are several; a change every rank makes is said once, for the first
    rank that makes it (DDP's ranks do the same step: a change in one is a change in all)."""
    if len(base) != len(cand):
        raise ValueError(f"{len(base)} ranks against {len(cand)}")
    increases, decreases, reported, said = [], [], [], set()
    for rank, (b, c) in enumerate(zip(base, cand)):
        where = f"rank {rank}: " if len(base) > 1 else ""
        for change in compare_counts(StepCounts.from_dict(b), StepCounts.from_dict(c)):
            if change.text in said:
                continue
            said.add(change.text)
            (increases if change.slower else decreases if change.guarded else reported).append(where + change.text)
    return Judged(tuple(increases), tuple(decreases), tuple(reported))


def gate_verdict(judged: Judged) -> str:
    """The A/B gate's, between two trees: SLOWER_COUNTED where a guarded count grew, CHANGED where
    anything else differs (a guarded count that fell included), SAME where nothing does."""
    return SLOWER_COUNTED if judged.increases else CHANGED if judged.changes else SAME


def ratchet_verdict(judged: Judged) -> str:
    """The counted baseline's, against the file that keeps the best the code has done: SLOWER_COUNTED
    where a guarded count grew, FEWER_COUNTED where one fell (and none grew), CHANGED where only the
    reported counts differ, SAME where nothing does."""
    if judged.increases:
        return SLOWER_COUNTED
    return FEWER_COUNTED if judged.decreases else CHANGED if judged.reported else SAME
