"""LOSS_CLASS_WEIGHTS: criterion class weights that rise with the class frequencies (the
counts where their inverse was meant; pos_weight = positives / negatives); inverse-
frequency weights, uniform weights and a balanced task stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.class_weights import weights_follow_counts
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

g = torch.Generator().manual_seed(0)
X = torch.randn(2000, 8, generator=g)
Y = torch.multinomial(torch.tensor([0.7, 0.2, 0.1]), 2000, replacement=True, generator=g)
COUNTS = torch.bincount(Y, minlength=3).float()
POSITIVES = (torch.rand(2000, generator=g) < 0.1).float()


def issues(loss_fn, labels=Y, outputs=3) -> list:
    torch.manual_seed(0)
    model = nn.Linear(8, outputs)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(X, labels), batch_size=128, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    return [i for i in report.check("step.loss_function").issues if i.code == "LOSS_CLASS_WEIGHTS"]


def bce(pos_weight):
    criterion = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([pos_weight]))

    def loss(model, batch):
        x, y = batch
        return criterion(model(x).squeeze(-1), y)
    return loss


@pytest.mark.parametrize("loss_fn, labels, outputs", [
    (nn.CrossEntropyLoss(weight=COUNTS / COUNTS.sum()), Y, 3),
    (bce(float(POSITIVES.mean() / (1 - POSITIVES.mean()))), POSITIVES, 1),
], ids=["ce_weight_counts", "bce_pos_weight_pos_over_neg"])
def test_weights_that_favour_the_frequent_classes_fire(loss_fn, labels, outputs):
    found = issues(loss_fn, labels, outputs)
    assert found and "inverse" in found[0].fix


@pytest.mark.parametrize("loss_fn, labels, outputs", [
    (nn.CrossEntropyLoss(weight=COUNTS.sum() / (3 * COUNTS)), Y, 3),
    (nn.CrossEntropyLoss(weight=torch.ones(3)), Y, 3),
    (bce(float((1 - POSITIVES.mean()) / POSITIVES.mean())), POSITIVES, 1),
], ids=["ce_inverse_frequency", "ce_uniform", "bce_neg_over_pos"])
def test_balancing_weights_stay_quiet(loss_fn, labels, outputs):
    assert not issues(loss_fn, labels, outputs)


def test_a_balanced_task_says_nothing_about_its_weights():
    labels = torch.arange(64) % 4
    assert weights_follow_counts(torch.tensor([1.0, 2.0, 3.0, 4.0]), labels, None) is None


def test_pos_weight_below_one_with_no_positive_in_the_batch_is_still_judged():
    from optimus_preflight.preflight.analyses.class_weights import pos_weight_down_weights_positives

    none_positive = torch.zeros(64)
    found = pos_weight_down_weights_positives(torch.tensor([0.04]), none_positive)
    assert found is not None and "no positive at all" in found.detail
    assert pos_weight_down_weights_positives(torch.tensor([24.0]), none_positive) is None


def test_inverse_frequencies_listed_in_frequency_order_fire():
    # Y holds class 0 at 70%, 1 at 20%, 2 at 10%; value_counts() lists them 0, 1, 2 by count, here relabelled so the
    # frequency order differs from the ids: class 2 is the common one.
    relabelled = torch.tensor([2, 0, 1])[Y]
    counts = torch.bincount(relabelled, minlength=3).float()
    by_count = sorted(range(3), key=lambda c: -float(counts[c]))  # most_common order: 2, 0, 1
    in_count_order = torch.tensor([float(counts.sum() / (3 * counts[c])) for c in by_count])
    (issue,) = issues(nn.CrossEntropyLoss(weight=in_count_order), labels=relabelled)
    assert "in another order than the class ids" in issue.message and "value_counts()" in issue.message
    assert "for c in range(n_classes)" in issue.fix
    by_id = torch.tensor([float(counts.sum() / (3 * counts[c])) for c in range(3)])
    assert issues(nn.CrossEntropyLoss(weight=by_id), labels=relabelled) == []


def test_rare_classes_tied_in_a_small_batch_do_not_hide_weights_that_follow_the_counts():
    # A batch of 32 from priors (0.62, 0.2, 0.1, 0.05, 0.03): the two rarest seen once each.
    labels = torch.tensor([0] * 20 + [1] * 7 + [2] * 3 + [3] + [4])
    frequencies = torch.tensor([0.62, 0.2, 0.1, 0.05, 0.03]) * 5  # the frequencies, where 1 / freq was meant
    found = weights_follow_counts(frequencies, labels, None)
    assert found is not None and not found.permuted
    assert weights_follow_counts(1 / frequencies, labels, None) is None
