"""step.regressed_classes: nominal class ids regressed by one output with MSELoss or L1Loss
(TARGET_NOMINAL_REGRESSED); ordered targets (binned scores, ratings from 1, counts) regressed
the same way stay quiet, and so does a real classifier."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.class_numbering import class_numbering
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.regressed_classes import RegressedClassesCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet

NAME = "step.regressed_classes"


def table(kind: str, rows: int = 1500, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 10, generator=g)
    score = x @ torch.randn(10, generator=g)
    if kind == "nominal":  # land-use types: each class its own direction
        y = (x @ torch.randn(10, 5, generator=g)).argmax(1)
    elif kind == "ordinal":  # a severity grade: one score, cut into levels, with noise
        y = torch.bucketize(score + 0.5 * torch.randn(rows, generator=g), torch.tensor([-2.0, -0.7, 0.7, 2.0]))
    elif kind == "ratings":  # stars 1-5 from a non-linear but monotone score
        y = torch.bucketize(torch.tanh(score / 3), torch.tensor([-0.5, -0.2, 0.2, 0.5])) + 1
    else:  # counts of events
        y = torch.poisson((0.4 * score).exp().clamp(max=15), generator=g).clamp(max=8)
    return x, y


def run(kind: str, criterion: nn.Module | None = None, classifier: bool = False):
    criterion = criterion if criterion is not None else nn.MSELoss()
    x, y = table(kind)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5 if classifier else 1))
    targets = y.long() if classifier else y.float().unsqueeze(1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, targets), batch_size=64, shuffle=True), loss_fn=criterion,
                           checks=[FirstBatchCheck(), FirstStepCheck(), RegressedClassesCheck()])
    return report.check(NAME)


@pytest.mark.parametrize("criterion", [nn.MSELoss(), nn.L1Loss()], ids=["mse", "l1"])
def test_nominal_class_ids_regressed_by_one_output_fire(criterion):
    result = run("nominal", criterion)
    issues = [i for i in result.issues if i.code == "TARGET_NOMINAL_REGRESSED"]
    assert issues, result.data
    assert "0, 1, 2, 3, 4" in issues[0].message and "nn.Linear(hidden, 5)" in issues[0].fix
    assert "CrossEntropyLoss" in issues[0].fix


@pytest.mark.parametrize("kind", ["ordinal", "ratings", "counts"])
def test_ordered_targets_regressed_by_one_output_stay_quiet(kind):
    result = run(kind)
    assert_quiet(result)
    assert result.data.get("directions"), result.data  # judged, not skipped


def test_a_classifier_over_the_same_classes_stays_quiet():
    result = run("nominal", nn.CrossEntropyLoss(), classifier=True)
    assert_quiet(result)
    assert "directions" not in result.data


def test_classes_the_inputs_do_not_separate_are_not_judged():
    g = torch.Generator().manual_seed(0)
    found = class_numbering(torch.randn(800, 6, generator=g), torch.randint(0, 4, (800,), generator=g).double())
    assert found is not None and not found.nominal
