"""SAMPLED_POSITIVE_NOT_TARGET: a sampled softmax whose logits put the positive last
(cat([neg, pos])) while the target is class 0 for every row. The positive first, and a
classifier whose batch happens to hold one class, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.sampled_positive import SampledPositiveCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

ITEMS = 50


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.user, self.items = nn.Linear(6, 8), nn.Embedding(ITEMS, 8)


def sampled_softmax(positive_first: bool):
    def loss(model, batch):
        features, positive = batch
        user = model.user(features)
        negatives = torch.randint(0, ITEMS, (len(positive), 10))
        pos = (user * model.items(positive)).sum(-1, keepdim=True)
        neg = torch.einsum("bd,bkd->bk", user, model.items(negatives))
        logits = torch.cat([pos, neg], 1) if positive_first else torch.cat([neg, pos], 1)
        return F.cross_entropy(logits, torch.zeros(len(positive), dtype=torch.long))
    return loss


@pytest.mark.parametrize("positive_first", [False, True], ids=["positive_last", "positive_first"])
def test_a_constant_target_must_name_the_positives_column(positive_first):
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(256, 6, generator=g), torch.randint(0, ITEMS, (256,), generator=g))
    model = TwoTower()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32),
                           loss_fn=sampled_softmax(positive_first),
                           checks=[FirstBatchCheck(), FirstStepCheck(), SampledPositiveCheck()])
    check = report.check("step.sampled_positive")
    assert check.data["positive_column"] == (0 if positive_first else 10)
    assert [i.code for i in check.issues] == ([] if positive_first else ["SAMPLED_POSITIVE_NOT_TARGET"])
    if check.issues:
        assert "torch.cat([pos_scores, neg_scores], 1)" in check.issues[0].fix


def test_a_classifier_whose_batch_holds_one_class_stays_quiet():
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(256, 6, generator=g), torch.zeros(256, dtype=torch.long))
    model = nn.Linear(6, 4)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(),
                                                                  SampledPositiveCheck()])
    assert report.check("step.sampled_positive").issues == []
