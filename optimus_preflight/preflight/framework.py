"""The preflight check framework: checks, their findings, and an isolating runner.

A check is a small class with a dotted ``name``, a ``stage`` and the names of the
checks it ``requires``; its ``run`` reports issues (each with a code, a severity, a
message, a fix and the config key involved) and measurements into ``Findings``.
The runner skips a check whose dependency failed, and turns an exception inside a
check into a ``crashed`` result so the other checks still run.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar


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


class SkipCheck(Exception):
    """Raised from ``run`` to end the check as ``skipped``, the message saying why
    (e.g. the data code it would call already hung in an earlier check)."""


class StopCheck(Exception):
    """Raised from ``run`` to end the check now; the issues it reported so far are its
    result (e.g. after reporting data code that hung, nothing more can be read)."""


class Check:
    """Base class. Subclasses set ``name``, ``stage``, ``requires`` and implement ``run``.

    ``applies(cfg)`` lets a check stay out of a run it has nothing to say about (the
    overfit smoke when ``preflight.overfit_steps=0``), rather than print a line.
    A check may put a one-line ``summary`` of its measurements in ``findings.data``;
    the console shows it next to the check's name.
    """

    name: ClassVar[str]
    stage: ClassVar[Stage]
    requires: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        return True

    def run(self, ctx: Any, findings: Findings) -> None:
        raise NotImplementedError


@dataclass
class CheckResult:
    name: str
    stage: Stage
    status: CheckStatus
    elapsed_s: float
    issues: list[Issue] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    # Why a check was skipped, or the exception of a crashed one.
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in (CheckStatus.PASSED, CheckStatus.WARNING)

    def to_dict(self) -> dict[str, Any]:
        payload = {
            "name": self.name,
            "stage": self.stage.value,
            "status": self.status.value,
            "elapsed_s": round(self.elapsed_s, 4),
            "issues": [issue.to_dict() for issue in self.issues],
            "data": self.data,
        }
        if self.detail:
            payload["detail"] = self.detail
        return payload


def _status_of(issues: Iterable[Issue]) -> CheckStatus:
    severities = {issue.severity for issue in issues}
    if Severity.ERROR in severities:
        return CheckStatus.ERROR
    if Severity.WARNING in severities:
        return CheckStatus.WARNING
    return CheckStatus.PASSED


BUILDER_OF_GROUP = {"model": "build_model", "optimizer": "build_optimizer", "scheduler": "build_scheduler",
                    "data": "build_dataloaders"}


def builder_of(key: str) -> str | None:
    """The recipe builder that reads a config key's group (``optimizer.lr`` -> build_optimizer)."""
    return BUILDER_OF_GROUP.get(key.split(".", 1)[0])


def fit_fixes_to_recipe(issues: list[Issue], key_applies: Any) -> list[Issue]:
    """A fix must work where it fires: when the recipe's own builder ignores an issue's
    config key, the issue names the code change instead (its ``code_fix``, or a pointer
    to the builder), and no longer claims the key."""
    if key_applies is None:
        return issues
    for issue in issues:
        if issue.config_key is None or key_applies(issue.config_key):
            continue
        builder = builder_of(issue.config_key)
        issue.fix = issue.code_fix or (
            f"{issue.fix} (Your recipe overrides {builder}() without calling the default, so {issue.config_key} "
            "takes effect only if that method reads it: make the equivalent change there.)"
        )
        issue.config_key = None
    return issues


def run_check(check: Check, ctx: Any, results: dict[str, CheckResult], disabled: frozenset[str]) -> CheckResult:
    if check.name in disabled:
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, 0.0, detail="disabled by preflight.disable")
    blocked = [name for name in check.requires if name in results and not results[name].ok]
    missing = [name for name in check.requires if name not in results]
    if blocked or missing:
        why = f"requires {', '.join(blocked + missing)}, which " + ("did not pass" if blocked else "did not run")
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, 0.0, detail=why)
    findings = Findings()
    key_applies = getattr(ctx, "key_applies", None)
    started = time.perf_counter()
    try:
        check.run(ctx, findings)
    except SkipCheck as skip:
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, time.perf_counter() - started,
                           data=findings.data, detail=str(skip))
    except StopCheck:
        pass  # the findings so far are the result
    except Exception as error:  # isolation: one broken check must not hide the others
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()
        tail = traceback.extract_tb(error.__traceback__)[-1]
        return CheckResult(
            check.name,
            check.stage,
            CheckStatus.CRASHED,
            time.perf_counter() - started,
            issues=fit_fixes_to_recipe([issue for issue in findings.issues if issue.code not in disabled], key_applies),
            data=findings.data,
            detail=f"{detail} (at {tail.filename}:{tail.lineno})",
        )
    issues = fit_fixes_to_recipe([issue for issue in findings.issues if issue.code not in disabled], key_applies)
    return CheckResult(check.name, check.stage, _status_of(issues), time.perf_counter() - started, issues, findings.data)


def run_checks(checks: Iterable[Check], ctx: Any, disabled: Iterable[str] = ()) -> list[CheckResult]:
    """Run checks stage by stage (stable within a stage)."""
    ordered = sorted(checks, key=lambda check: STAGE_ORDER.index(check.stage))
    disabled_set = frozenset(disabled)
    results: dict[str, CheckResult] = {}
    for check in ordered:
        results[check.name] = run_check(check, ctx, results, disabled_set)
    return list(results.values())
