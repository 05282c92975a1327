"""SAMPLE_WITHOUT_GRADIENT: a VAE whose latent is drawn with torch.normal(mu, std), whose gradient
with respect to mu and std is zero, so the encoder learns only from the KL; the reparameterised
draws (mu + std * randn_like, Normal.rsample) stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck


class VAE(nn.Module):
    def __init__(self, draw: str):
        super().__init__()
        torch.manual_seed(0)
        self.draw = draw
        self.encoder, self.decoder = nn.Linear(16, 8), nn.Linear(4, 16)

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, dim=-1)
        std = (0.5 * logvar).exp()
        if self.draw == "torch.normal":
            z = torch.normal(mu, std)
        elif self.draw == "rsample":
            z = torch.distributions.Normal(mu, std).rsample()
        else:
            z = mu + std * torch.randn_like(std)
        return self.decoder(z), mu, logvar


def elbo(model, batch):
    recon, mu, logvar = model(batch[0])
    kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(-1)
    return (F.mse_loss(recon, batch[0], reduction="none").sum(-1) + kl).mean()


@pytest.mark.parametrize("draw, fires", [("torch.normal", True), ("rsample", False), ("mu + std * eps", False)])
def test_a_latent_drawn_without_reparameterisation(draw, fires):
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
    model = VAE(draw)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x), batch_size=32, shuffle=True), loss_fn=elbo,
                           checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    found = [issue for issue in report.check("step.gradients").issues if issue.code == "SAMPLE_WITHOUT_GRADIENT"]
    assert bool(found) == fires
    if fires:
        assert "torch.normal" in found[0].message and "torch.randn_like(std)" in found[0].fix
