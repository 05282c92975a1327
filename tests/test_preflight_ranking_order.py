"""RANKING_PAIR_REVERSED: a margin ranking loss given each (preferred, other) pair the wrong way round."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
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
        assert issues[0].message.startswith("the pairwise ranking is reversed")


# ------------------------------------------- a pairwise loss written by hand over the model's two scores
class MatrixFactorisation(nn.Module):
    """BPR's model: a user's score for the positive and for the sampled negative item."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.users, self.items = nn.Embedding(50, 8), nn.Embedding(80, 8)

    def forward(self, user, positive, negative):
        u = self.users(user)
        return (u * self.items(positive)).sum(1), (u * self.items(negative)).sum(1)


class ItemScorer(nn.Module):
    """One call per item: the loss scores the positive and the negative separately."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.users, self.items = nn.Embedding(50, 8), nn.Embedding(80, 8)

    def forward(self, user, item):
        return (self.users(user) * self.items(item)).sum(1)


def triples() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    user = torch.randint(0, 50, (512,), generator=g)
    return TensorDataset(user, (user + torch.randint(0, 3, (512,), generator=g)) % 80,
                         torch.randint(0, 80, (512,), generator=g))


def bpr(reversed_: bool, per_item: bool = False):
    def loss_fn(model, batch):
        user, positive, negative = batch
        pos, neg = ((model(user, positive), model(user, negative)) if per_item else model(user, positive, negative))
        return -F.logsigmoid(neg - pos if reversed_ else pos - neg).mean()
    return loss_fn


@pytest.mark.parametrize("per_item", [False, True], ids=["one_call", "a_call_per_item"])
@pytest.mark.parametrize("reversed_", [True, False], ids=["negative_first", "positive_first"])
def test_a_bpr_loss_written_by_hand_that_ranks_the_negative_first_fires(reversed_, per_item):
    model = ItemScorer() if per_item else MatrixFactorisation()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(triples(), batch_size=64, shuffle=True), loss_fn=bpr(reversed_, per_item),
                           checks=[FirstBatchCheck(), FirstStepCheck(), RankingOrderCheck()])
    issues = report.check("step.ranking_order").issues
    assert bool(issues) == reversed_
    if issues:
        assert "batch[1]" in issues[0].message and "-F.logsigmoid(s_pos - s_neg)" in issues[0].fix
