"""A check's report for people (a table, the failure message) and for CI (JSON).

The JSON (`--json PATH`, docs/check.md has the schema) holds one record per check: name,
strategy, devices, status (pass / fail / finding / skipped), reason, errors, first_divergence
and reproduce.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from mgpu.parity.records import CheckResult, Report
from mgpu.strategies import RANK_STRATEGIES

__all__ = ["table", "failure_message", "write_json"]

_STATUS_ORDER = ("fail", "finding", "skipped", "pass")


def _who(result: CheckResult) -> str:
    if result.strategy is None:
        return "model"
    unit = "rank" if result.strategy in RANK_STRATEGIES else "device"
    return f"{result.strategy} x{result.devices} {unit}{'s' if result.devices != 1 else ''}"


def _err(result: CheckResult) -> str:
    rel = result.errors.get("max_rel") if result.errors else None
    if rel is None or (isinstance(rel, float) and not math.isfinite(rel)):
        return ""
    return f"{rel:.1e}"


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
                  f"in {report.seconds:.1f} s" + ("" if report.verified else " (NOT VERIFIED: see the top)")]
    return "\n".join(lines)


def _unit(result: CheckResult) -> str:
    return "rank" if result.strategy in RANK_STRATEGIES else "replica"


def failure_message(report: Report, result: CheckResult) -> str:
    """The assertion message of check_data_parallel: which check, the first divergence, the cause, how to reproduce."""
    head = f"{report.model}: {_who(result)}: check '{result.name}' {'failed' if result.status == 'fail' else 'is a finding'}"
    if result.status == "skipped":
        head = f"{report.model}: {report.unverified_summary()}"
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


def write_json(report: Report, path: str | Path) -> None:
    text = json.dumps(_finite(report.to_json()), indent=2, allow_nan=False, default=_jsonable)
    Path(path).write_text(text + "\n")


def _finite(value):
    """Infinite and NaN floats as null (JSON has neither): a relative error over a reference that is
    zero is infinite (timm's EfficientNet zero-initialises BatchNorm weights), and wrote no file."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value):
    if isinstance(value, float):
        return None
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
