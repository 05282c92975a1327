from __future__ import annotations

import time

from optimus_preflight.preflight.context import PreflightContext
from optimus_preflight.preflight.framework import run_checks
from optimus_preflight.preflight.report import PreflightReport
from optimus_preflight.summary import write_json_atomic


class PreflightMixin:
    """Runs the preflight checks and writes ``preflight.json``. Owns ``self.preflight_report``."""

    preflight_report: PreflightReport | None = None

    def preflight_checks(self) -> list:
        return []

    def preflight(self) -> PreflightReport:
        self.setup()
        started = time.perf_counter()
        results = run_checks(self.preflight_checks(), PreflightContext.from_recipe(self), self.cfg.preflight.disable)
        report = PreflightReport(results, time.perf_counter() - started, self.cfg.preflight.fail_on)
        if self.training_context.dist.is_main:
            write_json_atomic(self.run_dir / "preflight.json", report.to_dict())
        self.preflight_report = report
        return report
