"""model.buffer_lookups: BUFFER_LOOKED_UP_BY_IDS, a registered buffer used as an embedding
table (rows gathered with the batch's ids) that never trains; quiet on the Parameter twin
and on buffers indexed by what the model computes (positions, a codebook's nearest rows)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.buffer_lookups import BufferLookupsCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def ratings() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    users, items = torch.randint(0, 50, (512,), generator=g), torch.randint(0, 80, (512,), generator=g)
    return TensorDataset(users, items, torch.randn(512, generator=g))


class Factorisation(nn.Module):
    def __init__(self, as_buffer: bool, lookup: str = "index"):
        super().__init__()
        self.users = nn.Embedding(50, 8)
        factors = torch.randn(80, 8) * 0.3
        if as_buffer:
            self.register_buffer("item_factors", factors)  # "so it follows .to(device) and is saved"
        else:
            self.item_factors = nn.Parameter(factors)
        self.lookup = lookup

    def forward(self, users, items):
        if self.lookup == "index":
            rows = self.item_factors[items]
        elif self.lookup == "embedding":
            rows = F.embedding(items, self.item_factors)
        else:
            rows = self.item_factors.index_select(0, items)
        return (self.users(users) * rows).sum(1)


def mse(model, batch):
    users, items, rating = batch
    return F.mse_loss(model(users, items), rating)


def issues_of(model, data=None, loss_fn=mse):
    report = run_preflight(model, torch.optim.Adam([p for p in model.parameters() if p.requires_grad], 1e-2),
                           DataLoader(data or ratings(), batch_size=64, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), BufferLookupsCheck()])
    check = report.check("model.buffer_lookups")
    assert check.status.value in ("passed", "warning"), check.detail
    return check.issues


@pytest.mark.parametrize("lookup", ["index", "embedding", "index_select"])
def test_item_factors_registered_as_a_buffer_fire(lookup):
    issues = issues_of(Factorisation(as_buffer=True, lookup=lookup))
    assert [issue.code for issue in issues] == ["BUFFER_LOOKED_UP_BY_IDS"]
    assert "'item_factors', a (80, 8) buffer" in issues[0].message and "no gradient" in issues[0].message
    assert "nn.Parameter" in issues[0].fix


def test_the_parameter_twin_is_quiet():
    assert issues_of(Factorisation(as_buffer=False)) == []


class SinusoidalEncoder(nn.Module):
    """A fixed sinusoidal position table (a buffer on purpose) indexed by arange, and a frozen
    codebook indexed by each step's nearest entry: both looked up with ids the model makes."""

    def __init__(self):
        super().__init__()
        position, dim = torch.arange(64)[:, None], torch.arange(0, 16, 2)
        angle = position / (10000 ** (dim / 16))
        table = torch.zeros(64, 16)
        table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
        self.register_buffer("positions", table)
        self.register_buffer("codebook", torch.randn(32, 16))
        self.embed, self.head = nn.Embedding(40, 16), nn.Linear(16, 2)

    def forward(self, ids):
        hidden = self.embed(ids) + self.positions[torch.arange(ids.shape[1], device=ids.device)]
        nearest = torch.cdist(hidden, self.codebook.expand(ids.shape[0], -1, -1)).argmin(-1)
        quantised = hidden + (self.codebook[nearest] - hidden).detach()
        return self.head(quantised.mean(1) * math.sqrt(16))


def test_buffers_indexed_by_positions_or_a_codebook_search_are_quiet():
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randint(0, 40, (256, 12), generator=g), torch.randint(0, 2, (256,), generator=g))
    assert issues_of(SinusoidalEncoder(), data, loss_fn=nn.CrossEntropyLoss()) == []


class StateValue(nn.Module):
    """Fixed state features kept in a buffer, looked up by the batch's state ids and handed to an
    MLP that learns: the table is the input, not the model."""

    def __init__(self):
        super().__init__()
        self.register_buffer("features", torch.randn(30, 16, generator=torch.Generator().manual_seed(2)))
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, states):
        return self.net(self.features[states]).squeeze(-1)


def test_buffer_rows_handed_to_a_learning_layer_are_features_and_quiet():
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randint(0, 30, (512,), generator=g), torch.randn(512, generator=g))
    assert issues_of(StateValue(), data, loss_fn=lambda model, batch: F.mse_loss(model(batch[0]), batch[1])) == []
