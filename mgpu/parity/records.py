"""What a check produces: one `CheckResult` per check and strategy, gathered in a `Report`.

check.py makes them, report.py prints and writes them; both import them from here.

A report is *verified* when at most SKIPPED_SHARE_LIMIT of its comparisons with single-device
training were skipped. A model that draws random numbers in forward (beyond dropout, which the
check switches off) cannot be compared at all: every such check is skipped, and a check that
compared nothing must not look like one that passed (docs/check.md, "What passed means").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mgpu.config import CheckOptions
from mgpu.parity.compare import Divergence

__all__ = ["CheckResult", "Report", "STATUSES", "COMPARISONS", "NO_BUFFERS", "SKIPPED_SHARE_LIMIT"]

STATUSES = ("pass", "fail", "finding", "skipped")
# The checks that compare a run with single-device training (or its replicas with each other), as
# opposed to findings about the model.
COMPARISONS = ("start", "replicas", "ties", "gradients", "weights", "buffers", "optimizer", "statistics", "uneven",
               "accumulate", "all")
# The one skip that is not a comparison left out: there is nothing to compare.
NO_BUFFERS = "the model has no buffers"
# More than this share of the comparisons skipped, and the check is not verified: the summary says so
# first, --strict fails it, and the JSON's "verified" is false.
SKIPPED_SHARE_LIMIT = 0.10


@dataclass
class CheckResult:
    name: str                      # start, gradients, weights, buffers, optimizer, replicas, ties, statistics, uneven, accumulate; or a finding's name
    strategy: str | None
    devices: int | None
    status: str                    # pass | fail | finding | skipped
    reason: str = ""               # why skipped, what a finding means and what to do, a failure's cause
    errors: dict = field(default_factory=dict)   # worst error seen: max_abs, max_rel, ratio to the allowed
    first_divergence: Divergence | None = None
    reproduce: str | None = None

    @property
    def is_comparison(self) -> bool:
        return self.strategy is not None and self.name in COMPARISONS and self.reason != NO_BUFFERS

    def to_json(self) -> dict:
        return {"name": self.name, "strategy": self.strategy, "devices": self.devices, "status": self.status,
                "reason": self.reason, "errors": self.errors,
                "first_divergence": self.first_divergence.to_json() if self.first_divergence else None,
                "reproduce": self.reproduce}


@dataclass
class Report:
    model: str
    options: CheckOptions
    results: list[CheckResult]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def findings(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "finding"]

    @property
    def comparisons(self) -> list[CheckResult]:
        return [r for r in self.results if r.is_comparison]

    @property
    def skipped_comparisons(self) -> list[CheckResult]:
        return [r for r in self.comparisons if r.status == "skipped"]

    @property
    def verified(self) -> bool:
        """At most SKIPPED_SHARE_LIMIT of the comparisons skipped (and at least one made)."""
        made = self.comparisons
        return bool(made) and len(self.skipped_comparisons) <= SKIPPED_SHARE_LIMIT * len(made)

    def unverified_summary(self) -> str | None:
        """The line that heads a report whose comparisons were mostly skipped; None when verified."""
        if self.verified:
            return None
        skipped, made = self.skipped_comparisons, self.comparisons
        reasons = sorted({r.reason for r in skipped})
        return (f"NOT VERIFIED: {len(skipped)} of {len(made)} comparisons with single-device training were skipped"
                + (f" ({'; '.join(reasons)})" if reasons else "")
                + ": passing means only that nothing compared differed (--strict fails it)")

    def exit_code(self, strict: bool = False) -> int:
        """0 when every check passes (findings and skipped comparisons too, unless strict), 1 otherwise."""
        return 1 if self.failures or (strict and (self.findings or not self.verified)) else 0

    def to_json(self) -> dict:
        made, skipped = self.comparisons, self.skipped_comparisons
        return {"model": self.model, "options": asdict(self.options), "seconds": round(self.seconds, 3),
                "notes": self.notes, "exit_code": self.exit_code(), "verified": self.verified,
                "comparisons": {"made": len(made) - len(skipped), "skipped": len(skipped),
                                "skipped_share": round(len(skipped) / len(made), 4) if made else None,
                                "limit": SKIPPED_SHARE_LIMIT},
                "checks": [r.to_json() for r in self.results]}
