"""RANKING_PAIR_REVERSED: a margin ranking loss given each (preferred, other) pair the wrong way round."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.ranking_order import RankingOrderCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def document_pairs() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 8, generator=g), torch.randn(512, 8, generator=g)
    swap = (a[:, 0] < b[:, 0])[:, None]
    return TensorDataset(torch.where(swap, b, a), torch.where(swap, a, b))  # (more relevant, less relevant)


@pytest.mark.parametrize("order, target, fires", [("neg_pos", 1.0, True), ("pos_neg", 1.0, False),
                                                  ("neg_pos", -1.0, False)])
def test_a_margin_ranking_loss_given_the_pair_reversed(order, target, fires):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    criterion = nn.MarginRankingLoss(margin=0.5)

    def pair_loss(model, batch):
        pos, neg = batch
        s_pos, s_neg = model(pos).squeeze(-1), model(neg).squeeze(-1)
        first, second = (s_neg, s_pos) if order == "neg_pos" else (s_pos, s_neg)
        return criterion(first, second, torch.full_like(s_pos, target))

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(document_pairs(), batch_size=64, shuffle=True), loss_fn=pair_loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), RankingOrderCheck()])
    issues = report.check("step.ranking_order").issues
    assert [i.code for i in issues] == (["RANKING_PAIR_REVERSED"] if fires else [])
    if issues:
        assert "MarginRankingLoss(s_neg, s_pos, ones)" in issues[0].message and "(s_pos, s_neg" in issues[0].fix
