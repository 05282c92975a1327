"""step.loss_direction, LOSS_IGNORES_MISTAKES: a focal loss modulated by (1 - p) for every
sample (not 1 - p_t) makes confident false positives free; a class weighted 0 does the same.
The correct focal loss, BCE, cross-entropy with label smoothing and a regression stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.loss_direction import LossDirectionCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def focal(p_t: bool, gamma: float = 2.0, alpha: float = 0.75):
    def loss_fn(model, batch):
        x, y = batch
        logits = model(x).squeeze(-1)
        bce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
        p = torch.sigmoid(logits)
        modulated = p * y + (1 - p) * (1 - y) if p_t else p
        return ((alpha * y + (1 - alpha) * (1 - y)) * (1 - modulated) ** gamma * bce).mean()
    return loss_fn


def run(loss_fn, classes: int = 2):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 6, generator=g)
    if classes == 2:
        y = (torch.rand(512, generator=g) < 0.2).float()
        model = nn.Linear(6, 1)
    elif classes:
        y = torch.randint(0, classes, (512,), generator=g)
        model = nn.Linear(6, classes)
    else:
        y = x[:, 0] * 3
        model = nn.Linear(6, 1)
    torch.manual_seed(0)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossDirectionCheck()])
    return report.check("step.loss_direction")


def test_a_focal_loss_with_p_for_p_t_fires_on_the_negatives():
    (issue,) = run(focal(p_t=False)).issues
    assert issue.code == "LOSS_IGNORES_MISTAKES" and "confident mistakes on class 0" in issue.message
    assert "p_t = p * y + (1 - p) * (1 - y)" in issue.fix


def test_a_class_weighted_zero_fires():
    (issue,) = run(nn.CrossEntropyLoss(weight=torch.tensor([1.0, 0.0, 1.0])), classes=3).issues
    assert "class 1" in issue.message


def test_an_ignore_index_on_a_real_class_is_named_as_the_cause():
    (issue,) = run(nn.CrossEntropyLoss(ignore_index=2), classes=3).issues
    assert "class 2" in issue.message and "ignore_index=2" in issue.message and "focal" not in issue.message
    assert "Drop ignore_index" in issue.fix


def by_hand(modulation):
    """A binary focal loss written without any torch criterion: torch.sigmoid and torch.log only."""
    def loss_fn(model, batch):
        x, y = batch
        p = torch.sigmoid(model(x).squeeze(-1))
        p_t = torch.where(y == 1, p, 1 - p)
        return (modulation(p_t) * -torch.log(p_t.clamp_min(1e-6))).mean()
    return loss_fn


def test_a_focal_loss_modulated_by_p_t_itself_fires_on_every_class_without_a_criterion():
    (issue,) = run(by_hand(lambda p_t: p_t ** 2)).issues
    assert issue.code == "LOSS_IGNORES_MISTAKES" and "on any class" in issue.message
    assert "p_t ** gamma" in issue.message and "(1 - p_t) ** gamma" in issue.fix


def hinge(model, batch):
    return torch.relu(1 - (batch[1] * 2 - 1) * model(batch[0]).squeeze(-1)).mean()


@pytest.mark.parametrize("loss_fn, classes", [
    (focal(p_t=True), 2),
    (by_hand(lambda p_t: (1 - p_t) ** 2), 2),
    (hinge, 2),
    (lambda model, batch: F.mse_loss(torch.sigmoid(model(batch[0]).squeeze(-1)), batch[1]), 2),
    (lambda model, batch: F.binary_cross_entropy_with_logits(model(batch[0]).squeeze(-1), batch[1]), 2),
    (nn.CrossEntropyLoss(label_smoothing=0.1), 4),
    (lambda model, batch: F.mse_loss(model(batch[0]).squeeze(-1), batch[1]), 0),
], ids=["focal_p_t", "focal_by_hand", "hinge", "sigmoid_mse", "bce", "ce_label_smoothing", "regression"])
def test_proper_losses_are_quiet(loss_fn, classes):
    assert run(loss_fn, classes).issues == []


def test_embeddings_for_a_supervised_contrastive_loss_are_not_logits():
    def supcon(model, batch):
        x, y = batch
        z = F.normalize(model(x), dim=1)
        logits = z @ z.T / 0.1
        same = (y[:, None] == y[None, :]).float().fill_diagonal_(0)
        log_prob = logits - torch.logsumexp(logits.masked_fill(torch.eye(len(y), dtype=torch.bool), -1e9), 1, True)
        return -((same * log_prob).sum(1) / same.sum(1).clamp(min=1)).mean()

    result = run(supcon, classes=4)
    assert result.issues == [] and result.data["summary"] == "not a classifier returning one tensor of logits"


def multiclass_focal(from_top_class: bool):
    """A softmax focal loss written from log_softmax and gather: no torch criterion in the step."""
    def loss_fn(model, batch, gamma=2.0):
        x, y = batch
        log_p = F.log_softmax(model(x), 1)
        log_p_t = log_p.gather(1, y.unsqueeze(1)).squeeze(1)
        p_t = log_p.exp().max(1).values if from_top_class else log_p_t.exp()
        return (-(1 - p_t) ** gamma * log_p_t).mean()
    return loss_fn


@pytest.mark.parametrize("from_top_class, fires", [(True, True), (False, False)], ids=["max", "gather"])
def test_a_softmax_focal_loss_whose_p_t_is_the_top_class(from_top_class, fires):
    result = run(multiclass_focal(from_top_class), classes=3)
    assert [issue.code for issue in result.issues] == (["LOSS_IGNORES_MISTAKES"] if fires else [])
    if fires:
        assert "top class" in result.issues[0].message and ".gather(1, y[:, None])" in result.issues[0].fix


@pytest.mark.parametrize("at_risk_only", [True, False])
def test_per_interval_hazard_logits_beside_an_event_flag_are_not_class_scores(at_risk_only):
    # A discrete-time survival model: (B, K) hazard logits under BCE against one-hot event
    # intervals; the batch's last tensor is the 0/1 event flag, no class id of the K columns.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    # most subjects leave in the first two intervals, most of them by the event
    interval, event = torch.randint(0, 2, (256,), generator=g), (torch.rand(256, generator=g) < 0.8).float()

    def hazard_loss(model, batch):
        features, k, e = batch
        logits = model(features)
        steps = torch.arange(logits.shape[1])
        target = ((steps[None, :] == k[:, None]) & (e[:, None] > 0)).float()
        at_risk = (steps[None, :] <= k[:, None]).float() if at_risk_only else torch.ones_like(target)
        return (F.binary_cross_entropy_with_logits(logits, target, reduction="none") * at_risk).sum() / at_risk.sum()

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 6))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, interval, event), batch_size=64, shuffle=True),
                           loss_fn=hazard_loss, checks=[FirstBatchCheck(), FirstStepCheck(), LossDirectionCheck()])
    result = report.check("step.loss_direction")
    assert not result.issues and "right" not in result.data, result.data  # never read as class scores
