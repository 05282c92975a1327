"""step.survival_order: COX_RISK_SET_REVERSED, a Cox loss that sorts by time ascending before
logcumsumexp (each risk set is those who already failed); longest-first stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.survival_order import SurvivalOrderCheck
from tests.test_preflight_batch_order import survival_rows


def cox(descending: bool):
    def loss_fn(model, batch):
        x, time, event = batch
        order = torch.argsort(time, descending=descending)
        risk, event = model(x).squeeze(-1)[order], event[order]
        return -((risk - torch.logcumsumexp(risk, 0)) * event).sum() / event.sum().clamp_min(1.0)
    return loss_fn


@pytest.mark.parametrize("descending", [False, True], ids=["ascending", "longest_first"])
def test_a_cox_loss_sorted_by_time_ascending_ranks_the_wrong_way(descending):
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(survival_rows(), batch_size=128, shuffle=True), loss_fn=cox(descending),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SurvivalOrderCheck()])
    issues = report.check("step.survival_order").issues
    assert bool(issues) == (not descending)
    if issues:
        assert "descending=True" in issues[0].fix and "already failed" in issues[0].message


@pytest.mark.parametrize("batch_size", [1, 64])
def test_a_cox_loss_on_batches_of_one_subject_is_zero_and_named(batch_size):
    from optimus_preflight.preflight.checks.step_checks import GradientsCheck

    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    rows = [row for row in survival_rows() if float(row[2]) == 1.0]  # events only: a batch of one still has a term
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(rows, batch_size=batch_size, shuffle=True), loss_fn=cox(True),
                           checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    zero = [issue for issue in report.check("step.gradients").issues if issue.code == "GRAD_ZERO"]
    assert bool(zero) == (batch_size == 1)
    if zero:
        assert "single sample" in zero[0].message and "risk set" in zero[0].message and "batch_size=1" in zero[0].message
