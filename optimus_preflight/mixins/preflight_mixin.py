from __future__ import annotations

from typing import ClassVar

from optimus_preflight.mixins.contracts import PreflightHost
from optimus_preflight.preflight.defaults import default_checks
from optimus_preflight.preflight.framework import Check
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.preflight.framework.runner import run_preflight_checks


class PreflightMixin:
    """Runs the preflight checks, logs the report and writes ``preflight.json``.

    Owns ``self.preflight_report``. Override ``preflight_checks()`` to add or drop checks.
    """

    HOST: ClassVar[type] = PreflightHost
    preflight_report: PreflightReport | None = None

    def preflight_checks(self: PreflightHost) -> list[Check]:
        return default_checks(self.cfg)

    def preflight(self: PreflightHost) -> PreflightReport:
        self.setup()
        self.preflight_report = run_preflight_checks(self.preflight_checks(), self.preflight_context())
        return self.preflight_report
