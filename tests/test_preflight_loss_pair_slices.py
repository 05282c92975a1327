"""LOSS_PAIR_SLICES: a paired criterion (triplet, cosine-embedding, margin-ranking) whose
inputs are column slices of the same rows, from a stacked forward split along the feature
dim; the split along the rows stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.loss_spy import feature_slices_of_same_rows
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck


def triplet_loss(split_dim: int):
    criterion = nn.TripletMarginLoss(margin=0.5)

    def loss(model, batch):
        anchor, positive, negative = batch
        emb = model(torch.cat([anchor, positive, negative]))
        return criterion(*emb.chunk(3, dim=split_dim))
    return loss


def cosine_pair_loss(model, batch):
    left, right, _ = batch
    a, b = model(torch.cat([left, right])).split(24, dim=1)  # halves of every row's features
    return nn.functional.cosine_embedding_loss(a, b, torch.ones(a.shape[0]))


def findings(loss_fn) -> list:
    torch.manual_seed(0)
    data = [torch.randn(256, 32) for _ in range(3)]
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(*data), batch_size=32, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    return [i for i in report.check("step.loss_function").issues if i.code == "LOSS_PAIR_SLICES"]


@pytest.mark.parametrize("loss_fn", [triplet_loss(-1), cosine_pair_loss], ids=["triplet_chunk_dim-1", "cosine_split"])
def test_inputs_cut_from_the_same_rows_are_an_error(loss_fn):
    issues = findings(loss_fn)
    assert issues and issues[0].severity.value == "error"
    assert "dim=0" in issues[0].fix and "same rows" in issues[0].message


def test_a_stacked_forward_split_along_its_rows_is_quiet():
    assert not findings(triplet_loss(0))


def test_slices_of_different_rows_or_different_tensors_are_not_the_same_rows():
    emb = torch.randn(12, 6)
    assert feature_slices_of_same_rows(list(emb.chunk(3, dim=-1))) == 6
    assert feature_slices_of_same_rows(list(emb.chunk(3, dim=0))) is None
    assert feature_slices_of_same_rows([torch.randn(4, 2), torch.randn(4, 2)]) is None
