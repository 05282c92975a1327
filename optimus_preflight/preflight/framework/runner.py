"""One preflight run: the checks, the policy, the ranks' agreement, the report's outputs."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from optimus_preflight.preflight.framework.check import Check
from optimus_preflight.preflight.framework.consensus import agree_on_verdict
from optimus_preflight.preflight.framework.console import log_report
from optimus_preflight.preflight.framework.execution import run_checks
from optimus_preflight.preflight.framework.live import LiveCheckLine
from optimus_preflight.preflight.framework.preserve import snapshot_of
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.reporting.summary import write_json_atomic

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

REPORT_FILE = "preflight.json"


def run_preflight_checks(
    checks: Iterable[Check], ctx: PreflightContext, report_path: Path | None | bool = True
) -> PreflightReport:
    """Run ``checks`` under ``preflight.disable`` and ``preflight.fail_on``; every rank
    returns the same verdict; rank 0 logs the report and writes it to ``report_path``
    (default ``run_dir/preflight.json``; False or None: not written)."""
    policy = ctx.cfg.preflight
    started = time.perf_counter()
    # Taken once, restored by every check that runs steps and once more at the end, so
    # not even a check that forgets to protect the state can change training.
    snapshot = ctx.artifacts.snapshot = snapshot_of(ctx)
    rank = ctx.training.dist.rank
    live = LiveCheckLine.for_console() if rank == 0 else None
    try:
        with ctx.interruptible():
            results = run_checks(checks, ctx, policy.disable, live)
    finally:
        snapshot.restore()
        ctx.artifacts.snapshot = None
    report = PreflightReport(results, 0.0, policy.fail_on)
    agree_on_verdict(report, rank, ctx.artifacts.sample_hashes)
    report.elapsed_s = time.perf_counter() - started
    if rank == 0:
        path = Path(ctx.run_dir) / REPORT_FILE if report_path is True else report_path or None
        if path is not None:
            write_json_atomic(path, report.to_dict())
        log_report(report, path, verbose=bool(policy.get("verbose", False)),
                   failure_outcome=getattr(ctx, "failure_outcome", "training will not start"))
    return report
