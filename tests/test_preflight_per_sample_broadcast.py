"""LOSS_BROADCAST for a per-sample coefficient: a DDPM loss whose alphas_cumprod[t] (B,) meets
x0 (B, D) with D == B broadcasts along the features; with [:, None] it is quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.per_sample_broadcast import PerSampleWatch
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

BINS = 16


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("alphas_cumprod", torch.cumprod(1 - torch.linspace(1e-4, 0.05, 100), 0))
        self.net = nn.Sequential(nn.Linear(BINS + 1, 64), nn.SiLU(), nn.Linear(64, BINS))

    def forward(self, x, t):
        return self.net(torch.cat([x, t[:, None].float() / 100], 1))


def ddpm(per_row: bool):
    def loss_fn(model, batch):
        x0 = batch[0]
        t = torch.randint(0, 100, (len(x0),))
        noise = torch.randn_like(x0)
        ab = model.alphas_cumprod[t]
        if per_row:
            ab = ab[:, None]
        return F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)
    return loss_fn


@pytest.mark.parametrize("per_row", [False, True])
def test_a_noise_level_broadcast_along_the_bins(per_row):
    data = TensorDataset(torch.randn(512, BINS, generator=torch.Generator().manual_seed(0)))
    model = Denoiser()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(data, batch_size=BINS, shuffle=True, drop_last=True), loss_fn=ddpm(per_row),
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_BROADCAST"]
    assert bool(found) == (not per_row)
    if found:
        assert "per-sample coefficient of shape (16,)" in found[0].message and "[:, None]" in found[0].fix


def test_a_per_row_weight_on_a_table_of_pairs_written_as_a_column_is_not_followed():
    watch = PerSampleWatch()
    watch.rows = 8
    table, index = torch.rand(100), torch.arange(8)
    watch.before("__getitem__", (table, index))
    vector = table[index]
    watch.after(vector)
    watch.before("__getitem__", (vector, (slice(None), None)))  # [:, None]: a column, no longer (B,)
    column = vector[:, None]
    watch.after(column)
    watch.before("mul", (column, torch.rand(8, 8)))
    assert watch.found is None
    watch.before("mul", (vector, torch.rand(8, 8)))
    assert watch.found is not None and watch.found.other == (8, 8)


@pytest.mark.parametrize("score", ["matmul", "rowwise", "bias_column", "bias_squeezed"])
def test_a_pair_matrix_of_scores_against_per_sample_ratings(score):
    """A matrix-factorisation recommender scoring with u @ v.T: (B, B) predictions against (B,) ratings."""
    from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
    from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

    class MF(nn.Module):
        def __init__(self):
            super().__init__()
            self.users, self.items = nn.Embedding(50, 8), nn.Embedding(60, 8)
            self.user_bias = nn.Embedding(50, 1)

        def forward(self, pairs):
            u, v = self.users(pairs[:, 0]), self.items(pairs[:, 1])
            if score == "matmul":
                return u @ v.T
            bias = self.user_bias(pairs[:, 0])  # (B, 1)
            if score == "bias_column":
                return (u * v).sum(-1) + bias
            return (u * v).sum(-1) + (bias.squeeze(-1) if score == "bias_squeezed" else 0)

    g = torch.Generator().manual_seed(0)
    pairs = torch.stack([torch.randint(0, 50, (256,), generator=g), torch.randint(0, 60, (256,), generator=g)], 1)
    ratings = torch.rand(256, generator=g) * 4 + 1
    model = MF()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2),
                           DataLoader(TensorDataset(pairs, ratings), batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_BROADCAST"]
    if score == "matmul":
        assert len(found) == 1 and "(32, 32)" in found[0].message and "(u * v).sum(-1)" in found[0].fix
    elif score == "bias_column":
        assert len(found) == 1 and "a (32,) term and a (32, 1) column" in found[0].message
        assert "squeeze(-1)" in found[0].fix
    else:
        assert not found
