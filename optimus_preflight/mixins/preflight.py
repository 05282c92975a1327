from __future__ import annotations

from optimus_preflight.preflight.context import PreflightContext
from optimus_preflight.preflight.defaults import default_checks
from optimus_preflight.preflight.framework import Check
from optimus_preflight.preflight.report import PreflightReport
from optimus_preflight.preflight.runner import run_preflight


class PreflightMixin:
    """Runs the preflight checks, logs the report and writes ``preflight.json``.

    Owns ``self.preflight_report``. Override ``preflight_checks()`` to add or drop checks.
    """

    preflight_report: PreflightReport | None = None

    def preflight_checks(self) -> list[Check]:
        return default_checks(self.cfg)

    def preflight(self) -> PreflightReport:
        self.setup()
        self.preflight_report = run_preflight(self.preflight_checks(), PreflightContext.from_recipe(self))
        return self.preflight_report
