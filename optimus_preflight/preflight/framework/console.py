"""The console view of a report, readable in five seconds: a one-line count of the checks,
the memory verdict as a small table, one block per issue with its fix, the skipped checks
collapsed by reason, then the verdict. ``verbose`` adds a line for every check;
``preflight.json`` always has every check and every measurement."""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

from optimus_preflight.preflight.framework.execution import CheckResult
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
LEVEL = {Severity.ERROR: logging.ERROR, Severity.WARNING: logging.WARNING, Severity.INFO: logging.INFO}
# The checks whose measurements hold the step's memory breakdown, GPU first.
MEMORY_CHECKS = ("memory.vram_headroom", "memory.host_ram")
MEMORY_COLUMNS = (("parameters", "parameters_bytes"), ("gradients", "gradients_bytes"),
                  ("optimizer state", "optimizer_state_bytes"), ("activations", "activations_bytes"))


def count_line(report: PreflightReport) -> str:
    """``preflight: 45 checks: 40 passed, 2 with warnings, 1 failed, 2 skipped (3.1 s)``."""
    counts: dict[CheckStatus, int] = defaultdict(int)
    for check in report.checks:
        counts[check.status] += 1
    parts = [f"{counts[CheckStatus.PASSED]} passed"]
    for status, words in ((CheckStatus.WARNING, "with warnings"), (CheckStatus.ERROR, "with errors"),
                          (CheckStatus.CRASHED, "crashed"), (CheckStatus.SKIPPED, "skipped")):
        if counts[status]:
            parts.append(f"{counts[status]} {words}")
    return f"preflight: {len(report.checks)} checks: {', '.join(parts)} ({report.elapsed_s:.1f} s)"


def check_lines(report: PreflightReport, verbose: bool = True) -> list[str]:
    """A line per check; without ``verbose`` only crashed ones (a crash is no issue, and
    its exception is the only place it shows)."""
    shown = [check for check in report.checks if verbose or check.status == CheckStatus.CRASHED]
    width = max((len(check.name) for check in shown), default=10)
    lines = []
    for check in shown:
        elapsed = f"{check.elapsed_s:5.2f}s" if check.status != CheckStatus.SKIPPED else "     -"
        note = check.detail if check.status in (CheckStatus.SKIPPED, CheckStatus.CRASHED) else check.data.get("summary", "")
        lines.append(f"  {STATUS_LABEL[check.status]:<5} {check.name:<{width}} {elapsed}  {note or ''}".rstrip())
    return lines


def skipped_lines(report: PreflightReport, verbose: bool = False) -> list[str]:
    """The skipped checks, one line per reason: a big model on the meta device skips twenty
    checks for one reason, which is one line, not twenty."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for check in report.checks:
        if check.status == CheckStatus.SKIPPED:
            by_reason[check.detail or "no reason given"].append(check.name)
    lines = []
    for reason, names in by_reason.items():
        if len(names) == 1:
            lines.append(f"  skipped {names[0]}: {reason}")
        else:
            listed = f" ({', '.join(names)})" if verbose else ""
            lines.append(f"  skipped {len(names)} checks{listed}: {reason}")
    return lines


def format_bytes(count: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count:.0f} B"


def memory_table(check: CheckResult) -> list[str]:
    """The memory verdict's breakdown at the predicted peak as a two-row table, from the
    check's measurements; empty when it has none (skipped, or no estimate)."""
    data = check.data
    peak = data.get("need_bytes", data.get("peak_bytes"))
    if peak is None:
        return []
    columns = [(title, data[key]) for title, key in MEMORY_COLUMNS if key in data]
    other = peak - sum(value for _, value in columns)
    if columns and other > 0:  # the allocator's and the runtime's share: the columns add up to the peak
        columns.append(("other", other))
    columns.append(("peak", peak))
    if data.get("limit_bytes"):
        columns.append(("limit", data["limit_bytes"]))
    cells = [(title, format_bytes(value)) for title, value in columns]
    if data.get("limit_bytes"):
        share = peak / data["limit_bytes"]
        cells.append(("used", f"{share:.0%}" if share >= 0.01 else "<1%"))
    widths = [max(len(title), len(value)) for title, value in cells]
    strategy = data.get("strategy")
    ranks = data.get("world_size")
    where = f", {strategy}" if strategy else ""
    where += f", per rank of {ranks}" if ranks and ranks > 1 else ""
    return [
        f"  {check.name}{where}:",
        "    " + "  ".join(title.rjust(width) for (title, _), width in zip(cells, widths)),
        "    " + "  ".join(value.rjust(width) for (_, value), width in zip(cells, widths)),
    ]


def memory_lines(report: PreflightReport) -> list[str]:
    lines: list[str] = []
    for name in MEMORY_CHECKS:
        check = report.check(name)
        if check is not None and check.status != CheckStatus.SKIPPED:
            lines.extend(memory_table(check))
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


def verdict_line(report: PreflightReport, path: Path | None = None,
                 failure_outcome: str = "training will not start") -> str:
    errors = len(report.issues(Severity.ERROR))
    warnings = len(report.issues(Severity.WARNING))
    crashed = sum(check.status == CheckStatus.CRASHED for check in report.checks)
    parts = [f"{errors} error(s)", f"{warnings} warning(s)"] + ([f"{crashed} crashed check(s)"] if crashed else [])
    where = f"; report: {path}" if path else ""
    meaning = {
        "passed": "ready to train",
        "warnings": "training may start, but read the issues above",
        "failed": failure_outcome,
    }[report.status]
    return (f"preflight {report.status.upper()} in {report.elapsed_s:.1f} s ({', '.join(parts)}; "
            f"fail_on={report.fail_on}): {meaning}{where}")


def report_lines(report: PreflightReport, path: Path | None = None, *, verbose: bool = False,
                 failure_outcome: str = "training will not start") -> list[tuple[int, str]]:
    """(log level, line) of the whole console view, in order."""
    lines = [(logging.INFO, count_line(report))]
    lines += [(logging.INFO, line) for line in check_lines(report, verbose)]
    memory = memory_lines(report)
    if memory:
        lines += [(logging.INFO, "memory at the predicted peak:")] + [(logging.INFO, line) for line in memory]
    blocks = issue_lines(report)
    if blocks:
        lines.append((logging.INFO, "issues:"))
        lines += [(LEVEL[severity], line) for severity, block in blocks for line in block]
    if not verbose:  # verbose has them among the check lines
        lines += [(logging.INFO, line) for line in skipped_lines(report)]
    lines.append((logging.ERROR if report.failed else logging.INFO, verdict_line(report, path, failure_outcome)))
    return lines


def format_report(report: PreflightReport, path: Path | None = None, *, verbose: bool = False,
                  failure_outcome: str = "training will not start") -> str:
    return "\n".join(line for _, line in report_lines(report, path, verbose=verbose, failure_outcome=failure_outcome))


def log_report(report: PreflightReport, path: Path | None = None, logger: logging.Logger = log, *,
               verbose: bool = False, failure_outcome: str = "training will not start") -> None:
    """The same text as ``format_report``, one log record per line; issue lines at
    their severity's level so log filters and colours pick them out."""
    for level, line in report_lines(report, path, verbose=verbose, failure_outcome=failure_outcome):
        logger.log(level, "%s", line)
