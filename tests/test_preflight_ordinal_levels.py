"""TARGET_LEVEL_ALWAYS_ON: an ordinal grade encoded for a CORAL / cumulative-link head as
levels ``y >= k`` from k = 0, so the first level is 1 for every grade; the levels ``y > k``
stay quiet, and so do ordinary multi-label targets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck

GRADES = 5


def grades() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 10, generator=g)
    score = x @ torch.randn(10, generator=g) / 10 ** 0.5
    return x, torch.bucketize(score, torch.tensor([-1.0, -0.3, 0.3, 1.0]))


def coral_loss(inclusive: bool):
    def loss(model, batch):
        x, y = batch
        thresholds = torch.arange(GRADES - 1, device=y.device)
        levels = (y.unsqueeze(1) >= thresholds) if inclusive else (y.unsqueeze(1) > thresholds)
        return F.binary_cross_entropy_with_logits(model(x), levels.float())
    return loss


def issues(loss_fn, targets=None):
    x, y = grades()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, GRADES - 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y if targets is None else targets), batch_size=64, shuffle=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    return {i.code: i for i in report.check("step.targets").issues}


@pytest.mark.parametrize("inclusive, fires", [(True, True), (False, False)], ids=["y_ge_k", "y_gt_k"])
def test_levels_built_from_k_zero_inclusive_are_named(inclusive, fires):
    found = issues(coral_loss(inclusive))
    assert ("TARGET_LEVEL_ALWAYS_ON" in found) == fires, found
    assert "TARGET_ALWAYS_ON" not in found  # one finding for one cause
    if fires:
        issue = found["TARGET_LEVEL_ALWAYS_ON"]
        assert "y >= k" in issue.message and "one rank too high" in issue.message and "y > k" in issue.fix


def test_multi_label_targets_whose_rows_are_not_levels_stay_quiet():
    g = torch.Generator().manual_seed(1)
    tags = (torch.rand(512, GRADES - 1, generator=g) < 0.4).float()
    tags[:, 0] = 1.0  # one tag on every row, but the rows are no runs of ones
    found = issues(nn.BCEWithLogitsLoss(), tags)
    assert "TARGET_LEVEL_ALWAYS_ON" not in found


def skewed_grades() -> torch.Tensor:
    """Grades whose first level y > 0 holds for about 90% of the rows, the others for 5-20%."""
    x, _ = grades()
    g = torch.Generator().manual_seed(0)
    score = x @ torch.randn(10, generator=g) / 10 ** 0.5
    return torch.bucketize(score, torch.tensor([-1.5, 0.8, 1.1, 1.5]))


def test_a_frequent_first_level_of_ordinal_targets_is_no_always_on_label():
    found = issues(coral_loss(inclusive=False), skewed_grades())
    assert "TARGET_ALWAYS_ON" not in found and "TARGET_LEVEL_ALWAYS_ON" not in found, found


def test_ordinal_levels_given_to_cross_entropy_are_named_as_levels():
    def levels_into_cross_entropy(model, batch):
        x, y = batch
        levels = (y.unsqueeze(1) > torch.arange(GRADES - 1)).float()
        return F.cross_entropy(model(x), levels)

    issue = issues(levels_into_cross_entropy)["TARGET_MULTI_HOT"]
    assert "cumulative ordinal levels" in issue.message and "binary_cross_entropy_with_logits" in issue.fix
