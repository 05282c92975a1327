"""The console view of a report, readable in five seconds: one line per check, then the
issues with their fixes, then the verdict."""

from __future__ import annotations

import logging
from pathlib import Path

from optimus_preflight.preflight.framework.issues import CheckStatus, Severity
from optimus_preflight.preflight.framework.report import PreflightReport

log = logging.getLogger("optimus_preflight")

STATUS_LABEL = {
    CheckStatus.PASSED: "ok",
    CheckStatus.WARNING: "WARN",
    CheckStatus.ERROR: "ERROR",
    CheckStatus.SKIPPED: "skip",
    CheckStatus.CRASHED: "CRASH",
}
SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def check_lines(report: PreflightReport) -> list[str]:
    width = max((len(check.name) for check in report.checks), default=10)
    lines = []
    for check in report.checks:
        elapsed = f"{check.elapsed_s:5.2f}s" if check.status != CheckStatus.SKIPPED else "     -"
        note = check.detail if check.status in (CheckStatus.SKIPPED, CheckStatus.CRASHED) else check.data.get("summary", "")
        lines.append(f"  {STATUS_LABEL[check.status]:<5} {check.name:<{width}} {elapsed}  {note or ''}".rstrip())
    return lines


def issue_lines(report: PreflightReport) -> list[tuple[Severity, list[str]]]:
    """Errors first, then warnings, then notes; each with its fix and config key."""
    issues = sorted(report.issues(), key=lambda pair: SEVERITY_ORDER[pair[1].severity])
    blocks = []
    for check, issue in issues:
        label = {Severity.ERROR: "ERROR", Severity.WARNING: "WARNING", Severity.INFO: "note"}[issue.severity]
        first, *rest = issue.message.splitlines() or [""]
        block = [f"  {label} {issue.code} [{check.name}] {first}", *rest]
        if issue.fix:
            key = f" ({issue.config_key})" if issue.config_key else ""
            block.append(f"      fix{key}: {issue.fix}")
        blocks.append((issue.severity, block))
    return blocks


def verdict_line(report: PreflightReport, path: Path | None = None) -> str:
    errors = len(report.issues(Severity.ERROR))
    warnings = len(report.issues(Severity.WARNING))
    crashed = sum(check.status == CheckStatus.CRASHED for check in report.checks)
    parts = [f"{errors} error(s)", f"{warnings} warning(s)"] + ([f"{crashed} crashed check(s)"] if crashed else [])
    where = f"; report: {path}" if path else ""
    meaning = {
        "passed": "ready to train",
        "warnings": "training may start, but read the issues above",
        "failed": "training will not start",
    }[report.status]
    return (f"preflight {report.status.upper()} in {report.elapsed_s:.1f} s ({', '.join(parts)}; "
            f"fail_on={report.fail_on}): {meaning}{where}")


def format_report(report: PreflightReport, path: Path | None = None) -> str:
    lines = [f"preflight: {len(report.checks)} checks"] + check_lines(report)
    blocks = issue_lines(report)
    if blocks:
        lines.append("issues:")
        for _, block in blocks:
            lines.extend(block)
    lines.append(verdict_line(report, path))
    return "\n".join(lines)


def log_report(report: PreflightReport, path: Path | None = None, logger: logging.Logger = log) -> None:
    """The same text as ``format_report``, one log record per line; issue lines at
    their severity's level so log filters and colours pick them out."""
    logger.info("preflight: %d checks", len(report.checks))
    for line in check_lines(report):
        logger.info("%s", line)
    blocks = issue_lines(report)
    if blocks:
        logger.info("issues:")
    level = {Severity.ERROR: logging.ERROR, Severity.WARNING: logging.WARNING, Severity.INFO: logging.INFO}
    for severity, block in blocks:
        for line in block:
            logger.log(level[severity], "%s", line)
    logger.log(logging.ERROR if report.failed else logging.INFO, "%s", verdict_line(report, path))
