"""What a check produces and how it is shown: a `CheckResult` per check and strategy, gathered in a
`Report`; a table and the failure message for people, JSON for CI.

check.py, judge.py and findings.py make the results; this module holds, prints and writes them.

A report compared *enough* when at most SKIPPED_SHARE_LIMIT of its comparisons with single-device
training were skipped and some gradient was not zero; it is *verified* when it PASSED (the core's one
meaning: mgpu/check/report.py). A model that draws random numbers in forward
(beyond dropout, which the check switches off) cannot be compared at all: every such check is
skipped; a loss that cannot move the weights agrees under any strategy. A check that compared
nothing must not look like one that passed: its verdict is NOT VERIFIED, exit code 3 unless
accepted (docs/guide/check.md, 'What "passed" means').

The JSON (`--json PATH`, docs/guide/check.md has the schema) holds one record per check: name,
strategy, devices, status (pass / fail / finding / skipped), reason, errors, first_divergence
and reproduce; a non-finite float in it is null.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mgpu.check.divergence import Divergence
from mgpu.check.findings import ZERO_GRADIENTS, Finding
from mgpu.check.report import CheckReport, Verdict, write_json
from mgpu.config import CheckOptions
from mgpu.errors import EXIT_NOT_VERIFIED
from mgpu.strategies import RANK_STRATEGIES

__all__ = ["CheckResult", "Report", "COMPARISONS", "NO_BUFFERS", "SKIPPED_SHARE_LIMIT", "table",
           "failure_message", "write_json"]

# The checks that compare a run with single-device training (or its replicas with each other), as
# opposed to findings about the model.
COMPARISONS = ("start", "replicas", "ties", "gradients", "weights", "buffers", "optimizer", "statistics", "uneven",
               "accumulate", "all")
# The one skip that is not a comparison left out: there is nothing to compare.
NO_BUFFERS = "the model has no buffers"
# More than this share of the comparisons skipped, and the check is not verified: the summary says so
# first, it exits 3 (EXIT_NOT_VERIFIED) unless --accept-not-verified, and the JSON's "verified" is false.
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

    @classmethod
    def of_finding(cls, finding: Finding) -> "CheckResult":
        """A finding as the report's row: the model's, not a strategy's."""
        return cls(finding.name, None, None, "finding", finding.text, errors=dict(finding.errors))

    @property
    def is_comparison(self) -> bool:
        return self.strategy is not None and self.name in COMPARISONS and self.reason != NO_BUFFERS

    def to_json(self) -> dict:
        return {"name": self.name, "strategy": self.strategy, "devices": self.devices, "status": self.status,
                "reason": self.reason, "errors": self.errors,
                "first_divergence": self.first_divergence.to_json() if self.first_divergence else None,
                "reproduce": self.reproduce}


@dataclass
class Report(CheckReport):
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
    def zero_gradients(self) -> CheckResult | None:
        return next((r for r in self.findings if r.name == ZERO_GRADIENTS), None)

    @property
    def enough_compared(self) -> bool:
        """At most SKIPPED_SHARE_LIMIT of the comparisons skipped (and at least one made), and some
        gradient not zero (a loss that cannot move the weights passes every comparison). JSON
        "enough_compared" (until 2026-11-28 this was the JSON's "verified": see CheckReport.verified)."""
        made = self.comparisons
        return (bool(made) and len(self.skipped_comparisons) <= SKIPPED_SHARE_LIMIT * len(made)
                and self.zero_gradients is None)

    def unverified_summary(self) -> str | None:
        """The line that heads a report that is not verified, saying why; None when verified."""
        if self.enough_compared:
            return None
        ending = (f": passing means only that nothing compared differed (exit {EXIT_NOT_VERIFIED}; "
                  "--accept-not-verified accepts it)")
        if self.zero_gradients is not None:
            return ("NOT VERIFIED: every gradient of the single-device steps is zero (finding zero-gradients): "
                    "a loss that cannot move the weights agrees under any strategy" + ending)
        skipped, made = self.skipped_comparisons, self.comparisons
        reasons = sorted({r.reason for r in skipped})
        return (f"NOT VERIFIED: {len(skipped)} of {len(made)} comparisons with single-device training were skipped"
                + (f" ({'; '.join(reasons)})" if reasons else "") + ending)

    @property
    def verdict(self) -> Verdict:
        """FAILED when a check failed; NOT_VERIFIED when too many comparisons were skipped; else PASSED."""
        if self.failures:
            return Verdict.FAILED
        return Verdict.PASSED if self.enough_compared else Verdict.NOT_VERIFIED

    def failing(self, strict: bool = False) -> list[CheckResult]:
        """The results that fail the report: its failures; else, under strict, its findings."""
        if self.failures or not strict:
            return self.failures
        return self.findings

    def first_failure(self, strict: bool = False) -> str:
        """The first failing result's message; else why the report is not verified; else its last line."""
        failing = self.failing(strict)
        if failing:
            return failure_message(self, failing[0])
        if not self.enough_compared:
            return f"{self.model}: {self.unverified_summary()}"
        return table(self).rsplit("\n", 1)[-1]

    def text(self) -> str:
        return table(self)

    def to_json(self) -> dict:
        made, skipped = self.comparisons, self.skipped_comparisons
        return {"model": self.model, "options": asdict(self.options), "seconds": round(self.seconds, 3),
                "notes": self.notes, "exit_code": self.exit_code(), "verdict": self.verdict.value,
                "verified": self.verified, "enough_compared": self.enough_compared,
                "comparisons": {"made": len(made) - len(skipped), "skipped": len(skipped),
                                "skipped_share": round(len(skipped) / len(made), 4) if made else None,
                                "limit": SKIPPED_SHARE_LIMIT},
                "checks": [r.to_json() for r in self.results]}


def _who(result: CheckResult) -> str:
    if result.strategy is None:
        return "model"
    unit = "rank" if result.strategy in RANK_STRATEGIES else "device"
    return f"{result.strategy} x{result.devices} {unit}{'s' if result.devices != 1 else ''}"


def table(report: Report) -> str:
    """One row per strategy and device count (its checks' statuses), then findings and failures."""
    rows = {}
    for r in report.results:
        if r.strategy is not None:
            rows.setdefault(_who(r), []).append(r)
    checks = []
    for results in rows.values():
        for r in results:
            if r.name not in checks:
                checks.append(r.name)
    mark = {"pass": "ok", "fail": "FAIL", "skipped": "skip", "finding": "note"}
    width = max([len(w) for w in rows] + [10])
    lines = [f"mgpu check: {report.model}", ""]
    unverified = report.unverified_summary()
    if unverified:
        lines += [unverified, ""]
    header = f"{'':<{width}}  " + "  ".join(f"{c[:10]:>10}" for c in checks)
    lines.append(header)
    for who, results in rows.items():
        by_name = {r.name: r for r in results}
        cells = []
        for c in checks:
            r = by_name.get(c) or by_name.get("all")
            cells.append(f"{mark[r.status] if r else '-':>10}")
        lines.append(f"{who:<{width}}  " + "  ".join(cells))
    findings = [r for r in report.results if r.status == "finding"]
    if findings:
        lines += ["", "findings (the model's, not mgpu's; they do not fail the check unless --strict):"]
        lines += [f"  {r.name}: {r.reason}" for r in findings]
    skipped = [r for r in report.results if r.status == "skipped"]
    reasons = sorted({r.reason for r in skipped})
    if reasons:
        lines += ["", "skipped:"] + [f"  {reason}" for reason in reasons]
    failures = report.failures
    if failures:
        lines += ["", f"{len(failures)} check(s) FAILED; the first divergence of each:"]
        for r in failures:
            lines.append(f"  {_who(r)}, {r.name}: {r.first_divergence.describe(_unit(r)) if r.first_divergence else r.reason}")
            if r.reason and r.first_divergence:
                lines.append(f"    cause: {r.reason}")
            if r.reproduce:
                lines.append(f"    reproduce: {r.reproduce}")
    for note in report.notes:
        lines += ["", f"note: {note}"]
    passed = sum(r.status == "pass" for r in report.results)
    lines += ["", f"{passed} passed, {len(failures)} failed, {len(findings)} finding(s), {len(skipped)} skipped "
                  f"in {report.seconds:.1f} s" + ("" if report.enough_compared else " (NOT VERIFIED: see the top)")]
    return "\n".join(lines)


def _unit(result: CheckResult) -> str:
    return "rank" if result.strategy in RANK_STRATEGIES else "replica"


def failure_message(report: Report, result: CheckResult) -> str:
    """The assertion message of check_data_parallel: which check, the first divergence, the cause, how to reproduce."""
    head = f"{report.model}: {_who(result)}: check '{result.name}' {'failed' if result.status == 'fail' else 'is a finding'}"
    lines = [head]
    if result.first_divergence:
        lines.append(result.first_divergence.describe(_unit(result)))
    if result.reason:
        lines.append(("cause: " if result.status == "fail" else "") + result.reason)
    if result.reproduce:
        lines.append(f"reproduce: {result.reproduce}")
    others = len(report.failures) - (result.status == "fail")
    if others > 0:
        lines.append(f"({others} other check(s) failed too)")
    return "\n".join(lines)
