"""data.ranking_negatives: NEGATIVES_ARE_POSITIVES, BPR triples whose negative sampler's
rejection loop is inverted (every negative one of the user's items); quiet when the user's
items are rejected, and for uniform negatives without rejection."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.ranking_negatives import RankingNegativesCheck

USERS, ITEMS = 40, 300


class Triples(Dataset):
    def __init__(self, sampler: str):
        rng = random.Random(0)
        self.seen = {u: set(rng.sample(range(ITEMS), 12)) for u in range(USERS)}
        self.pairs = [(u, i) for u, items in self.seen.items() for i in sorted(items)]
        self.sampler, self.rng = sampler, random.Random(1)

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, index):
        user, positive = self.pairs[index]
        negative = self.rng.randrange(ITEMS)
        if self.sampler == "inverted":
            while negative not in self.seen[user]:  # keeps drawing until it IS one of the user's items
                negative = self.rng.randrange(ITEMS)
        elif self.sampler == "rejecting":
            while negative in self.seen[user]:
                negative = self.rng.randrange(ITEMS)
        return user, positive, negative


class Factors(nn.Module):
    def __init__(self):
        super().__init__()
        self.users, self.items = nn.Embedding(USERS, 8), nn.Embedding(ITEMS, 8)

    def forward(self, users, items):
        return (self.users(users) * self.items(items)).sum(-1)


def bpr(model, batch):
    users, positives, negatives = batch
    return -nn.functional.logsigmoid(model(users, positives) - model(users, negatives)).mean()


@pytest.mark.parametrize("sampler, fires", [("inverted", True), ("rejecting", False), ("uniform", False)])
def test_negatives_drawn_from_the_users_own_items(sampler, fires):
    model = Factors()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(Triples(sampler), batch_size=64, shuffle=True), loss_fn=bpr,
                           checks=[FirstBatchCheck(), RankingNegativesCheck()])
    found = report.check("data.ranking_negatives").issues
    assert [issue.code for issue in found] == (["NEGATIVES_ARE_POSITIVES"] if fires else [])
    if found:
        assert "while j in seen[u]" in found[0].fix
