"""TARGET_MULTI_HOT for multi-hot rows divided by their label count (1/k each) into
cross_entropy: the labels compete in one softmax; mixup and label-smoothed soft targets,
whose non-zero entries differ, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck

g = torch.Generator().manual_seed(0)
X = torch.randn(512, 16, generator=g)
MULTI_HOT = (torch.rand(512, 6, generator=g) < 0.3).float()
MULTI_HOT[MULTI_HOT.sum(1) == 0, 0] = 1.0
ONE_HOT = nn.functional.one_hot(torch.randint(0, 6, (512,), generator=g), 6).float()
LAM = torch.rand(512, 1, generator=g)

TARGETS = {
    "normalised_multi_hot": (MULTI_HOT / MULTI_HOT.sum(1, keepdim=True), True),
    "mixup": (LAM * ONE_HOT + (1 - LAM) * ONE_HOT.roll(1, 0), False),
    "label_smoothing": (ONE_HOT * 0.9 + 0.1 / 6, False),
}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_normalised_multi_hot_rows_fire_and_soft_labels_stay_quiet(name):
    targets, fires = TARGETS[name]
    torch.manual_seed(0)
    model = nn.Linear(16, 6)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(X, targets), batch_size=64, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    issues = [i for i in report.check("step.targets").issues if i.code == "TARGET_MULTI_HOT"]
    assert bool(issues) == fires
    if fires:
        assert "1/k" in issues[0].message and "BCEWithLogitsLoss" in issues[0].fix
