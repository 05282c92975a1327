from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn
from torch.optim import Optimizer

from optimus_preflight.preflight.framework import Check
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.preflight.framework.runner import run_preflight_checks
from optimus_preflight.preflight.standalone import run_preflight


class PreflightMixin:
    """The preflight checks on your model, optimizer and loaders, before the long run.

    In a loop of your own: ``self.run_preflight(model, optimizer, train_loader,
    loss_fn=..., precision=..., accumulation_steps=..., raise_on_failure=True)`` (the
    keywords of ``optimus_preflight.preflight.run_preflight``); the loop's objects are
    bitwise what they were afterwards. A recipe runs the checks on the context it
    builds (``run_preflight_checks``). Owns ``self.preflight_report``.
    """

    preflight_report: PreflightReport | None = None

    def run_preflight(self, model: nn.Module, optimizer: Optimizer, train_loader: Iterable[Any],
                      **options: Any) -> PreflightReport:
        self.preflight_report = run_preflight(model, optimizer, train_loader, **options)
        return self.preflight_report

    def run_preflight_checks(self, context: PreflightContext, checks: Sequence[Check]) -> PreflightReport:
        """``checks`` on ``context`` (logged, ``preflight.json`` written when it has a run dir)."""
        self.preflight_report = run_preflight_checks(list(checks), context)
        return self.preflight_report
