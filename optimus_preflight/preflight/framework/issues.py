"""What a check reports: issues (a code, a severity, a message, a fix, the config key
involved) and measurements, collected in ``Findings``; and the stages checks run in."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Stage(str, Enum):
    ENVIRONMENT = "environment"
    CONFIG = "config"
    DATA = "data"
    MODEL = "model"
    STEP = "step"


STAGE_ORDER = list(Stage)


class CheckStatus(str, Enum):
    PASSED = "passed"
    WARNING = "warning"
    ERROR = "error"
    SKIPPED = "skipped"
    CRASHED = "crashed"


@dataclass
class Issue:
    code: str
    severity: Severity
    message: str
    fix: str
    config_key: str | None = None
    # The fix as a code change, for a recipe whose own builder ignores ``config_key``
    # (e.g. ``optimizer.*`` when the recipe overrides ``build_optimizer``).
    code_fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        payload = {"code": self.code, "severity": self.severity.value, "message": self.message, "fix": self.fix}
        if self.config_key:
            payload["config_key"] = self.config_key
        return payload


@dataclass
class Findings:
    """What one check found: issues, and measurements under ``data``."""

    issues: list[Issue] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, severity: Severity | str, code: str, message: str, fix: str, key: str | None = None,
            code_fix: str | None = None) -> None:
        self.issues.append(Issue(code, Severity(severity), message, fix, key, code_fix))

    def error(self, code: str, message: str, fix: str, key: str | None = None, code_fix: str | None = None) -> None:
        self.add(Severity.ERROR, code, message, fix, key, code_fix)

    def warning(self, code: str, message: str, fix: str, key: str | None = None, code_fix: str | None = None) -> None:
        self.add(Severity.WARNING, code, message, fix, key, code_fix)

    def info(self, code: str, message: str, fix: str = "", key: str | None = None, code_fix: str | None = None) -> None:
        self.add(Severity.INFO, code, message, fix, key, code_fix)



# Codes the framework and the data access report on behalf of whichever check met the
# problem, so no single check declares them; ``preflight.disable`` accepts them too.
DATA_TIMEOUT = "DATA_TIMEOUT"
CHECK_CRASHED = "CHECK_CRASHED"
FRAMEWORK_CODES: dict[str, str] = {
    DATA_TIMEOUT: "a data call of any check did not return within preflight.first_batch_timeout_s",
    CHECK_CRASHED: "a check crashed on another rank (torchrun)",
}
