"""step.loss_scale O9, a loss partly summed over the batch: a per-sample mean plus a term summed
over the samples (a VAE's KL summed over the batch beside an averaged reconstruction), found
because halves and quarters of the batch give losses that fit mean + sum exactly. Losses
that couple samples (in-batch negatives) change with the batch size too, but not that way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.step_runs import LossScaleCheck, summed_term


class SensorVAE(nn.Module):
    def __init__(self, features: int = 12, latent: int = 4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 2 * latent))
        self.decoder = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, features))

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()  # samples in eval mode too
        return self.decoder(z), mu, logvar


def vae_loss(kl_over_batch: bool):
    def loss(model, batch):
        (x,) = batch
        recon, mu, logvar = model(x)
        reconstruction = F.mse_loss(recon, x, reduction="none").sum(1).mean()
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp())
        kl = kl.sum(0).mean() if kl_over_batch else kl.sum(1).mean()
        return reconstruction + kl
    return loss


def infonce(model, batch):
    a, b = batch
    za, zb = F.normalize(model(a), dim=1), F.normalize(model(b), dim=1)
    logits = za @ zb.T / 0.1
    return F.cross_entropy(logits, torch.arange(len(a)))


def o9(model, loader, loss_fn) -> list:
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossScaleCheck()])
    return [i for i in report.check("step.loss_scale").issues if i.code == "O9"]


def sensors() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 12, generator=g) * 2
    return DataLoader(TensorDataset(x), batch_size=128, shuffle=True, generator=g)


def test_a_kl_summed_over_the_batch_beside_a_mean_reconstruction_fires():
    torch.manual_seed(0)
    found = o9(SensorVAE(), sensors(), vae_loss(kl_over_batch=True))
    assert len(found) == 1
    assert "part of the loss is summed over the batch" in found[0].message
    assert "kl.sum(dim=1).mean()" in found[0].fix


def test_every_term_averaged_over_the_batch_is_quiet():
    torch.manual_seed(0)
    assert not o9(SensorVAE(), sensors(), vae_loss(kl_over_batch=False))


def test_in_batch_negatives_are_not_a_summed_term():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(1024, 16, generator=g)
    pairs = DataLoader(TensorDataset(a, a + 0.1 * torch.randn(1024, 16, generator=g)), batch_size=128, shuffle=True)
    assert not o9(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), pairs, infonce)


@pytest.mark.parametrize(("full", "halves", "quarters", "expected"), [
    (3.0, [2.0, 2.0], [1.5] * 4, 2 / 3),  # r = 1, s = 2: parts sum to k + 2, s is 2/3 of the loss
    (2.0, [2.0, 2.0], [2.0] * 4, None),  # a mean: no summed term
    (4.0, [2.0, 2.0], [1.0] * 4, None),  # a pure sum: the other warning's case
    (4.85, [4.16, 4.16], [3.47] * 4, None),  # ln(B) of in-batch negatives: not linear in the parts
])
def test_summed_term_reads_mean_plus_sum(full, halves, quarters, expected):
    found = summed_term(full, halves, quarters)
    assert (found is None) if expected is None else found == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("labels", ["zeros", "arange"])
def test_in_batch_contrastive_logits_scored_against_column_0(labels):
    from optimus_preflight.preflight.checks.step_checks import TargetsCheck

    g = torch.Generator().manual_seed(4)
    a = torch.randn(512, 16, generator=g)
    pairs = DataLoader(TensorDataset(a, a + 0.1 * torch.randn(512, 16, generator=g)), batch_size=64, shuffle=True)

    def loss(model, batch):
        za, zb = F.normalize(model(batch[0]), dim=1), F.normalize(model(batch[1]), dim=1)
        logits = za @ zb.T / 0.1
        target = torch.zeros(len(logits), dtype=torch.long) if labels == "zeros" else torch.arange(len(logits))
        return F.cross_entropy(logits, target)

    model = nn.Linear(16, 8)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), pairs, loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    found = [i for i in report.check("step.targets").issues if i.code == "TARGET_ONE_CLASS"]
    if labels == "zeros":
        assert len(found) == 1 and "torch.arange" in found[0].fix and "diagonal" in found[0].message
    else:
        assert not found


@pytest.mark.parametrize("layout", ["product", "positive_first"])
def test_a_small_batch_of_in_batch_scores_needs_the_product_to_be_judged(layout):
    # 16 rows: (B, B) scores that are a @ b.T have their positives on the diagonal whatever the
    # batch size; square scores built as [positive, negatives] put them in column 0 by design.
    from optimus_preflight.preflight.checks.step_checks import TargetsCheck

    g = torch.Generator().manual_seed(4)
    a = torch.randn(256, 16, generator=g)
    pairs = DataLoader(TensorDataset(a, a + 0.1 * torch.randn(256, 16, generator=g)), batch_size=16, shuffle=True)

    def loss(model, batch):
        za, zb = F.normalize(model(batch[0]), dim=1), F.normalize(model(batch[1]), dim=1)
        if layout == "product":
            logits = za @ zb.T / 0.1
        else:
            positive = (za * zb).sum(1, keepdim=True)
            negatives = (za * zb.roll(1, 0)).sum(1, keepdim=True).expand(-1, len(za) - 1)
            logits = torch.cat([positive, negatives], dim=1) / 0.1
        return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long))

    model = nn.Linear(16, 8)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), pairs, loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    found = [i for i in report.check("step.targets").issues if i.code == "TARGET_ONE_CLASS"]
    assert len(found) == (layout == "product")


@pytest.mark.parametrize("second_column", [0, 1])
def test_two_heads_fitted_to_the_same_target_column(second_column):
    from optimus_preflight.preflight.checks.step_checks import TargetsCheck

    g = torch.Generator().manual_seed(5)
    x = torch.randn(512, 6, generator=g)
    y = torch.stack([x[:, 0] * 2, x[:, 1] - x[:, 2]], dim=1)  # casual and registered riders

    def two_task(model, batch):
        inputs, targets = batch
        out = model(inputs)
        return F.mse_loss(out[:, 0], targets[:, 0]) + F.mse_loss(out[:, 1], targets[:, second_column])

    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True), loss_fn=two_task,
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    found = [i for i in report.check("step.targets").issues if i.code == "TARGET_COLUMN_REUSED"]
    if second_column == 0:
        assert len(found) == 1 and "column 1 is the target of no term" in found[0].message
    else:
        assert not found
