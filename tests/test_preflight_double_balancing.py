"""step.double_balancing: LOSS_WEIGHTS_ON_BALANCED_SAMPLER, a balancing WeightedRandomSampler and
balancing class weights together; either one alone stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.double_balancing import DoubleBalancingCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

G = torch.Generator().manual_seed(0)
X = torch.randn(2000, 6, generator=G)
Y = (torch.rand(2000, generator=G) < 0.05).long()  # 5% positives
COUNTS = torch.bincount(Y).float()


def run(sampler: bool, criterion: nn.Module):
    model = nn.Linear(6, 2) if isinstance(criterion, nn.CrossEntropyLoss) else nn.Sequential(nn.Linear(6, 1),
                                                                                             nn.Flatten(0))
    data = TensorDataset(X, Y if isinstance(criterion, nn.CrossEntropyLoss) else Y.float())
    if sampler:
        weights = (1.0 / COUNTS)[Y]
        loader = DataLoader(data, batch_size=128, sampler=WeightedRandomSampler(
            weights, len(Y), generator=torch.Generator().manual_seed(1)))
    else:
        loader = DataLoader(data, batch_size=128, shuffle=True)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=criterion,
                           checks=[FirstBatchCheck(), FirstStepCheck(), DoubleBalancingCheck()])
    return report.check("step.double_balancing").issues


@pytest.mark.parametrize("criterion", [
    nn.CrossEntropyLoss(weight=COUNTS.sum() / (2 * COUNTS)),
    nn.BCEWithLogitsLoss(pos_weight=COUNTS[0] / COUNTS[1]),
], ids=["ce_weight", "bce_pos_weight"])
def test_a_balancing_sampler_and_balancing_weights_together_fire(criterion):
    (issue,) = run(True, criterion)
    assert "balanced twice" in issue.message and "drop the criterion's" in issue.fix


@pytest.mark.parametrize("sampler, criterion", [
    (True, nn.CrossEntropyLoss()),
    (False, nn.CrossEntropyLoss(weight=COUNTS.sum() / (2 * COUNTS))),
], ids=["sampler_only", "weights_only"])
def test_either_correction_alone_is_quiet(sampler, criterion):
    assert run(sampler, criterion) == []
