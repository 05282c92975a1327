"""Running checks in isolation: stage order, a failed dependency skips its dependents,
an exception inside a check becomes a ``crashed`` result so the other checks still run,
and each fix is fitted to what the recipe reads."""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from optimus_preflight.preflight.framework.check import Check, PreflightBug, SkipCheck, StopCheck
from optimus_preflight.preflight.framework.device_bounds import host_bounds_checked
from optimus_preflight.preflight.framework.issues import STAGE_ORDER, CheckStatus, Findings, Issue, Severity, Stage
from optimus_preflight.preflight.framework.registry import validate_checks

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext
    from optimus_preflight.preflight.framework.live import LiveCheckLine


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


def _bounds_guard(check: Check, ctx: PreflightContext) -> contextlib.AbstractContextManager:
    """On an accelerator, the host-side index bounds (``device_bounds``): a probe batch or a
    target out of range raises there as on the CPU instead of ending the process's CUDA context."""
    device = getattr(ctx, "device", None)
    if check.timed or device is None:
        return contextlib.nullcontext()
    return host_bounds_checked(device, getattr(ctx, "model", None))


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
    bounds = _bounds_guard(check, ctx)
    try:
        with bounds:
            check.run(ctx, findings)
    except SkipCheck as skip:
        return CheckResult(check.name, check.stage, CheckStatus.SKIPPED, time.perf_counter() - started,
                           data=findings.data, detail=str(skip))
    except StopCheck:
        pass  # the findings so far are the result
    except Exception as error:  # isolation: one broken check must not hide the others
        detail = "".join(traceback.format_exception_only(type(error), error)).strip()
        tail = traceback.extract_tb(error.__traceback__)[-1]
        # A crash is a bug (the preflight's, or a check's): its whole traceback goes to preflight.json.
        findings.data["traceback"] = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        if isinstance(error, PreflightBug) and error.original_traceback:
            findings.data["traceback"] = error.original_traceback + "\n" + findings.data["traceback"]
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


def run_checks(checks: Iterable[Check], ctx: PreflightContext, disabled: Iterable[str] = (),
               live: LiveCheckLine | None = None) -> list[CheckResult]:
    """Run checks stage by stage (stable within a stage); ``live`` shows the running one."""
    checks = list(checks)
    validate_checks(checks)
    ordered = sorted(checks, key=lambda check: STAGE_ORDER.index(check.stage))
    disabled_set = frozenset(disabled)
    results: dict[str, CheckResult] = {}
    for check in ordered:
        with live.running(check.name) if live is not None else contextlib.nullcontext():
            results[check.name] = run_check(check, ctx, results, disabled_set)
    return list(results.values())
