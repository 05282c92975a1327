"""ORDINAL_CODES_UNORDERED: an ordinal (CORAL) loss over grades encoded in alphabetical order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.ordinal_codes import OrdinalCodesCheck, order_fit
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

GRADES = ["low", "medium", "high", "very high"]


def graded(rows: int, alphabetical: bool) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 8, generator=g)
    grade = torch.bucketize(x @ torch.linspace(-1, 1, 8), torch.tensor([-0.8, 0.0, 0.8]))
    names = [GRADES[i] for i in grade.tolist()]
    classes = sorted(GRADES) if alphabetical else GRADES
    return TensorDataset(x, torch.tensor([classes.index(name) for name in names]))


class Coral(nn.Module):
    def __init__(self):
        super().__init__()
        self.score = nn.Linear(8, 1)
        self.thresholds = nn.Parameter(torch.linspace(-1, 1, 3))

    def forward(self, x):
        return self.score(x) - self.thresholds


def coral_loss(model, batch):
    x, y = batch
    logits = model(x)
    return F.binary_cross_entropy_with_logits(logits, (y[:, None] > torch.arange(3, device=y.device)).float())


@pytest.mark.parametrize("alphabetical", [True, False])
def test_grades_encoded_alphabetically_under_an_ordinal_loss(alphabetical):
    model = Coral()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(graded(1500, alphabetical), batch_size=64, shuffle=True), loss_fn=coral_loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), OrdinalCodesCheck()])
    issues = report.check("step.ordinal_codes").issues
    assert [i.code for i in issues] == (["ORDINAL_CODES_UNORDERED"] if alphabetical else [])
    if issues:
        assert "order 1 < 2 < 0 < 3" in issues[0].message and "OrdinalEncoder(categories=" in issues[0].fix


def test_the_reverse_order_fits_as_well_and_is_not_a_relabelling():
    x = torch.randn(400, 3, generator=torch.Generator().manual_seed(1))
    codes = torch.bucketize(-x[:, 0], torch.tensor([-0.5, 0.5]))  # grades that fall as the input rises
    given, best, _ = order_fit(x, codes, 3)
    assert given == pytest.approx(best)
