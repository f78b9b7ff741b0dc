"""One report for both checks: the verdict, the exit code, the first failure, and JSON.

    report.verdict                 # Verdict.PASSED | FAILED | NOT_VERIFIED ("passed", "failed", "not verified")
    report.exit_code(strict=True)  # 0, 1 or 3 (EXIT_NOT_VERIFIED), by `exit_code` below
    report.raise_unless_accepted() # the API's ending: ParityError, NotVerifiedError, or the report
    report.write_json("check.json")

Each source's report (`mgpu.check.model.report.Report`, `mgpu.check.script.report.ScriptReport`) derives
from `CheckReport` and says what it judged: its verdict, its findings, its first failure as a
sentence, its text and its JSON record. What a verdict means for CI is written here, once.
"""

from __future__ import annotations

import abc
import enum
import json
from pathlib import Path

from mgpu.errors import EXIT_FAILED, EXIT_NOT_VERIFIED, EXIT_OK, NotVerifiedError, ParityError
from mgpu.jsonsafe import finite_or_none

__all__ = ["Verdict", "exit_code", "CheckReport", "write_json"]


class Verdict(str, enum.Enum):
    """What a check concluded. A str, so that a verdict compares with and writes as its words."""

    PASSED = "passed"              # everything compared agreed
    FAILED = "failed"              # something differs beyond rounding, or a run crashed or hung
    NOT_VERIFIED = "not verified"  # nothing differed, but too little could be compared to say so

    def __str__(self) -> str:
        return self.value


def exit_code(verdict: Verdict, has_findings: bool, strict: bool = False, accept_not_verified: bool = False) -> int:
    """1 (EXIT_FAILED) for FAILED; 3 (EXIT_NOT_VERIFIED) for NOT_VERIFIED unless accepted
    (accept_not_verified: a check that verified nothing must not turn a CI job green unasked);
    under strict, 1 for any finding of a report not refused already; else 0."""
    if verdict == Verdict.FAILED:
        return EXIT_FAILED
    if verdict == Verdict.NOT_VERIFIED and not accept_not_verified:
        return EXIT_NOT_VERIFIED
    if strict and has_findings:
        return EXIT_FAILED
    return EXIT_OK


class CheckReport(abc.ABC):
    """The base of both reports. A subclass gives `verdict` (a Verdict) and `findings` (a list:
    fields or properties) and the three methods below (a subclass lacking one cannot be made);
    the exit code and the JSON file follow from them the same way for both."""

    verdict: Verdict
    findings: list

    @abc.abstractmethod
    def first_failure(self, strict: bool = False) -> str:
        """What failed first (under strict a finding counts), or why nothing could be verified, as the
        message of an AssertionError."""

    @abc.abstractmethod
    def text(self) -> str:
        """The report as the command prints it."""

    @abc.abstractmethod
    def to_json(self) -> dict:
        """The report's JSON record (write_json makes it strict)."""

    @property
    def verified(self) -> bool:
        """The one meaning of "verified" for both checks (JSON "verified"): the verdict is PASSED, so the
        check compared enough and nothing differed. (`check`'s JSON "verified" meant "enough compared"
        until 2026-11-28: that is now its "enough_compared".)"""
        return self.verdict == Verdict.PASSED

    def exit_code(self, strict: bool = False, accept_not_verified: bool = False) -> int:
        return exit_code(self.verdict, bool(self.findings), strict, accept_not_verified)

    def raise_unless_accepted(self, strict: bool = False, accept_not_verified: bool = False) -> "CheckReport":
        """The API's ending (check_script, check_data_parallel), as the command's exit code decides:
        NotVerifiedError (a ParityError) for a NOT VERIFIED not accepted, ParityError for any other
        refusal, each with the first failure as its message and the report as `.report`; else the report."""
        code = self.exit_code(strict, accept_not_verified)
        if code == EXIT_NOT_VERIFIED:
            raise NotVerifiedError(self.first_failure(), self)
        if code:  # FAILED, or under strict a finding: then the finding is what fails it
            raise ParityError(self.first_failure(strict=self.verdict != Verdict.FAILED), self)
        return self

    def write_json(self, path: str | Path) -> None:
        write_json(self, path)


def write_json(report: CheckReport, path: str | Path) -> None:
    """The report as strict JSON: an infinite or NaN float as null (a relative error over a reference
    that is zero is infinite: timm's EfficientNet zero-initialises BatchNorm weights)."""
    text = json.dumps(finite_or_none(report.to_json()), indent=2, allow_nan=False, default=_jsonable)
    Path(path).write_text(text + "\n")


def _jsonable(value):
    if isinstance(value, float):
        return None
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
