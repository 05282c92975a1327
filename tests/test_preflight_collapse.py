"""step.collapse, REPRESENTATION_COLLAPSE: a SimSiam loss without the stop-gradient collapses
every embedding to one vector; with z.detach() it holds, and a supervised cosine regression
between two branches (Sentence-BERT style) is no collapse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.collapse import CollapseCheck, spread
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class SimSiam(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 32))
        self.predictor = nn.Sequential(nn.Linear(32, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 32))


def simsiam(stop_gradient: bool):
    def loss_fn(model, batch):
        x = batch[0]
        z1, z2 = model.encoder(x + 0.3 * torch.randn_like(x)), model.encoder(x + 0.3 * torch.randn_like(x))
        p1, p2 = model.predictor(z1), model.predictor(z2)
        if stop_gradient:
            z1, z2 = z1.detach(), z2.detach()
        return -(F.cosine_similarity(p1, z2, dim=-1).mean() + F.cosine_similarity(p2, z1, dim=-1).mean()) / 2
    return loss_fn


def rows():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g)[torch.randint(0, 8, (1024,), generator=g)] + \
        0.5 * torch.randn(1024, 16, generator=g)


def run(model, loss_fn, data):
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           DataLoader(data, batch_size=128, shuffle=True, drop_last=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), CollapseCheck()])
    return report.check("step.collapse")


@pytest.mark.parametrize("stop_gradient", [False, True])
def test_simsiam_without_the_stop_gradient_collapses(stop_gradient):
    result = run(SimSiam(), simsiam(stop_gradient), TensorDataset(rows()))
    assert [issue.code for issue in result.issues] == ([] if stop_gradient else ["REPRESENTATION_COLLAPSE"])
    if stop_gradient:
        assert result.data["summary"] == "no similarity between two tensors that both carry gradients"
    else:
        assert "z2.detach()" in result.issues[0].fix and result.data["spread_last"] * 2.5 <= result.data["spread_first"]


def test_a_supervised_cosine_between_two_branches_does_not_collapse():
    g = torch.Generator().manual_seed(1)
    a, b = rows(), rows()
    score = F.cosine_similarity(a, b, dim=-1) + 0.1 * torch.randn(1024, generator=g)
    encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32))

    def loss_fn(model, batch):
        left, right, target = batch
        return F.mse_loss(F.cosine_similarity(model(left), model(right), dim=-1), target)

    result = run(encoder, loss_fn, TensorDataset(a, b, score))
    assert result.issues == [] and result.data["similarity"] == "cosine_similarity"


def test_spread_is_zero_for_one_vector_repeated():
    assert spread(torch.ones(8, 4)) == pytest.approx(0.0, abs=1e-6) and spread(torch.eye(4)) == pytest.approx(0.5)
