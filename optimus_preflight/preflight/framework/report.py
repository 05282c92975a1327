"""PreflightReport: the verdict under the configured policy, preflight.json, the console view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optimus_preflight.preflight.framework.execution import CheckResult
from optimus_preflight.preflight.framework.issues import CheckStatus, Severity

VERDICTS = ("passed", "warnings", "failed")


@dataclass
class PreflightReport:
    checks: list[CheckResult] = field(default_factory=list)
    elapsed_s: float = 0.0
    fail_on: str = "error"

    def issues(self, severity: Severity | None = None):
        return [
            (check, issue)
            for check in self.checks
            for issue in check.issues
            if severity is None or issue.severity == severity
        ]

    @property
    def status(self) -> str:
        """failed: the run must not start under ``fail_on``; warnings: it may, but look."""
        has_errors = bool(self.issues(Severity.ERROR))
        has_warnings = bool(self.issues(Severity.WARNING)) or any(
            check.status == CheckStatus.CRASHED for check in self.checks
        )
        if (has_errors and self.fail_on in ("error", "warning")) or (has_warnings and self.fail_on == "warning"):
            return "failed"
        if has_errors or has_warnings:
            return "warnings"
        return "passed"

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def check(self, name: str) -> CheckResult | None:
        return next((check for check in self.checks if check.name == name), None)

    def codes(self) -> set[str]:
        return {issue.code for _, issue in self.issues()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "elapsed_s": round(self.elapsed_s, 4),
            "fail_on": self.fail_on,
            "checks": [check.to_dict() for check in self.checks],
        }
