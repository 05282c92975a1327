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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from optimus_preflight.training.contracts import ContractError

if TYPE_CHECKING:
    from optimus_preflight.preflight.preflight_context import PreflightContext


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


class CheckDefinitionError(TypeError):
    """A developer's mistake in a check class or a check list, raised when the class is
    defined or the list is registered, never as a crashed or silently skipped check."""


# Every concrete check class by name, so a ``requires`` can be told from a typo.
_KNOWN_CHECKS: dict[str, type[Check]] = {}


def known_checks() -> dict[str, type[Check]]:
    """Every concrete check class defined so far, by name: the shipped ones and those of
    any imported recipe or plugin module."""
    return dict(_KNOWN_CHECKS)


class Check:
    """Base class. Subclasses set ``name``, ``stage``, ``requires`` and implement ``run``.

    A base class meant only to be subclassed says so: ``class MyBase(Check, abstract=True)``.

    ``applies(cfg)`` lets a check stay out of a run it has nothing to say about (the
    overfit smoke when ``preflight.overfit_steps=0``), rather than print a line.
    A check may put a one-line ``summary`` of its measurements in ``findings.data``;
    the console shows it next to the check's name.
    """

    name: ClassVar[str]
    stage: ClassVar[Stage]
    requires: ClassVar[tuple[str, ...]] = ()
    # Whether the check reads or runs the model's real weights, or judges training on this
    # machine; None: the model and step stages do. A model too large for this machine is
    # kept on the meta device for the memory verdict (preflight.memory.world_size), and
    # the checks that need weights skip.
    needs_weights: ClassVar[bool | None] = None

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not abstract:
            _define(cls)

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        return True

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        raise NotImplementedError


def _define(cls: type[Check]) -> None:
    where = f"{cls.__module__}.{cls.__qualname__}"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise CheckDefinitionError(
            f"{where} has no name: set a class attribute such as name = \"data.my_check\" "
            "(or declare a base class with `class {cls.__name__}(Check, abstract=True)`).")
    stage = getattr(cls, "stage", None)
    try:
        cls.stage = Stage(stage)
    except ValueError:
        raise CheckDefinitionError(
            f"{where} ({name}) has stage={stage!r}: set stage to one of "
            f"{', '.join('Stage.' + member.name for member in Stage)}.") from None
    if isinstance(cls.requires, str) or not all(isinstance(other, str) for other in cls.requires):
        example = f" such as ({cls.requires!r},)" if isinstance(cls.requires, str) else ""
        raise CheckDefinitionError(
            f"{where} ({name}) has requires={cls.requires!r}: give a tuple of check names{example}.")
    cls.requires = tuple(cls.requires)
    if not callable(getattr(cls, "run", None)) or cls.run is Check.run:
        raise CheckDefinitionError(f"{where} ({name}) does not implement run(self, ctx, findings).")
    previous = _KNOWN_CHECKS.get(name)
    # A subclass that keeps its parent's name replaces it (a tuned default check); the
    # same class defined again (a reloaded module, a re-run notebook cell) replaces itself.
    if previous is not None and not issubclass(cls, previous) and (
            f"{previous.__module__}.{previous.__qualname__}" != where):
        raise CheckDefinitionError(
            f"two checks are named {name!r}: {previous.__module__}.{previous.__qualname__} and {where}; "
            "give one of them another name.")
    _KNOWN_CHECKS[name] = cls


def validate_checks(checks: Iterable[Check | type[Check]]) -> None:
    """Refuse a check list the runner could only run wrongly: two checks with one name
    (one result would hide the other), or a ``requires`` naming an unknown check, a
    check of a later stage, or a check placed after it in the same stage (each would
    skip the dependent on every run)."""
    classes = [check if isinstance(check, type) else type(check) for check in checks]
    ordered = sorted(classes, key=lambda cls: STAGE_ORDER.index(cls.stage))
    position: dict[str, int] = {}
    for index, cls in enumerate(ordered):
        if cls.name in position:
            raise CheckDefinitionError(f"the check list holds {cls.name!r} twice: drop one.")
        position[cls.name] = index
    for cls in ordered:
        for needed in cls.requires:
            required = _KNOWN_CHECKS.get(needed)
            if required is None:
                close = [known for known in _KNOWN_CHECKS if known.split(".")[-1] == needed.split(".")[-1]]
                raise CheckDefinitionError(
                    f"{cls.name} requires {needed!r}, which is no known check"
                    + (f" (did you mean {close[0]!r}?)" if close else "") + ".")
            if STAGE_ORDER.index(required.stage) > STAGE_ORDER.index(cls.stage):
                raise CheckDefinitionError(
                    f"{cls.name} (stage {cls.stage.value}) requires {needed} of the later stage "
                    f"{required.stage.value}, which runs after it: move {cls.name} to stage "
                    f"{required.stage.value} or later, or drop the requirement.")
            if needed in position and position[needed] > position[cls.name]:
                raise CheckDefinitionError(
                    f"{cls.name} requires {needed}, which comes after it in stage {cls.stage.value}: "
                    "list it first.")


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


def fix_in_overridden_builder(issue: Issue) -> str:
    builder = builder_of(issue.config_key or "")
    return issue.code_fix or (
        f"{issue.fix} (Your recipe overrides {builder}() without calling the default, so {issue.config_key} "
        "takes effect only if that method reads it: make the equivalent change there.)"
    )


def fit_fixes_to_recipe(
    issues: list[Issue],
    key_applies: Callable[[str], bool] | None,
    unread_key_fix: Callable[[Issue], str] | None = None,
) -> list[Issue]:
    """A fix must work where it fires: when nothing reads an issue's config key (the
    recipe's own builder ignores it, or the loop is not a recipe at all), the issue names
    the code change instead (``unread_key_fix``, by default its ``code_fix`` or a pointer
    to the builder), and no longer claims the key."""
    if key_applies is None:
        return issues
    for issue in issues:
        if issue.config_key is None or key_applies(issue.config_key):
            continue
        issue.fix = (unread_key_fix or fix_in_overridden_builder)(issue)
        issue.config_key = None
    return issues


def _needs_weights(check: Check) -> bool:
    return check.stage in (Stage.MODEL, Stage.STEP) if check.needs_weights is None else check.needs_weights


def run_check(check: Check, ctx: PreflightContext, results: dict[str, CheckResult], disabled: frozenset[str]) -> CheckResult:
    if check.name in disabled:
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, 0.0, detail="disabled by preflight.disable")
    if not getattr(ctx, "weights_materialized", True) and _needs_weights(check):
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, 0.0,
                           detail="the model is on the meta device (too large for this machine's RAM, so it will not train here): "
                           "only the memory verdict and the data checks run")
    blocked = [name for name in check.requires if name in results and not results[name].ok]
    missing = [name for name in check.requires if name not in results]
    if blocked or missing:
        why = f"requires {', '.join(blocked + missing)}, which " + ("did not pass" if blocked else "did not run")
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, 0.0, detail=why)
    findings = Findings()
    key_applies = getattr(ctx, "key_applies", None)
    unread_key_fix = getattr(ctx, "fix_for_unread_key", None)
    started = time.perf_counter()
    try:
        check.run(ctx, findings)
    except SkipCheck as skip:
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, time.perf_counter() - started,
                           data=findings.data, detail=str(skip))
    except StopCheck:
        pass  # the findings so far are the result
    except ContractError:
        raise  # the recipe broke its contract (training/contracts.py): no check can judge it, exit 2
    except Exception as error:  # isolation: one broken check must not hide the others
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()
        tail = traceback.extract_tb(error.__traceback__)[-1]
        return CheckResult(
            check.name,
            check.stage,
            CheckStatus.CRASHED,
            time.perf_counter() - started,
            issues=fit_fixes_to_recipe([issue for issue in findings.issues if issue.code not in disabled], key_applies, unread_key_fix),
            data=findings.data,
            detail=f"{detail} (at {tail.filename}:{tail.lineno})",
        )
    issues = fit_fixes_to_recipe([issue for issue in findings.issues if issue.code not in disabled], key_applies, unread_key_fix)
    return CheckResult(check.name, check.stage, _status_of(issues), time.perf_counter() - started, issues, findings.data)


def run_checks(checks: Iterable[Check], ctx: PreflightContext, disabled: Iterable[str] = ()) -> list[CheckResult]:
    """Run checks stage by stage (stable within a stage)."""
    checks = list(checks)
    validate_checks(checks)
    ordered = sorted(checks, key=lambda check: STAGE_ORDER.index(check.stage))
    disabled_set = frozenset(disabled)
    results: dict[str, CheckResult] = {}
    for check in ordered:
        results[check.name] = run_check(check, ctx, results, disabled_set)
    return list(results.values())
