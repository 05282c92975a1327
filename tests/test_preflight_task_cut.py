"""TASK_LOSS_CUT: layers that feed the model's output only through argmin/argmax, so the task
term never reaches them (a vector quantiser without the straight-through estimator), or only
through a random draw that passes no gradient (a VAE's latent drawn with ``Distribution.sample()``
or ``torch.normal(mu, std)``); the straight-through version, where only the codebook is out of the
task's reach by design, an argmax over the model's own logits, the reparameterised draw and a
sample taken under no_grad for a metric stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck


class Quantised(nn.Module):
    def __init__(self, straight_through: bool):
        super().__init__()
        torch.manual_seed(0)
        self.straight_through = straight_through
        self.encoder = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
        self.codebook = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        z_e = self.encoder(x)
        z_q = self.codebook(torch.cdist(z_e, self.codebook.weight).argmin(-1))
        z = z_e + (z_q - z_e).detach() if self.straight_through else z_q
        return self.head(z), z_e, z_q


def vq_loss(model, batch):
    x, y = batch
    logits, z_e, z_q = model(x)
    return F.cross_entropy(logits, y) + F.mse_loss(z_q, z_e.detach()) + 0.25 * F.mse_loss(z_e, z_q.detach())


def cut(model, loss) -> list:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 12, generator=g), torch.randint(0, 3, (256,), generator=g))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32),
                           loss_fn=loss, checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    return [i for i in report.check("step.gradients").issues if i.code == "TASK_LOSS_CUT"]


@pytest.mark.parametrize("straight_through", [False, True])
def test_a_quantiser_without_the_straight_through_estimator(straight_through):
    found = cut(Quantised(straight_through), vq_loss)
    assert bool(found) == (not straight_through)
    if found:
        assert "encoder.0.weight" in found[0].message and "z_e + (z_q - z_e).detach()" in found[0].fix
        assert "codebook" not in found[0].message.split("(")[1].split(")")[0]


def test_an_argmax_over_the_models_own_scores_is_not_a_cut():
    # a second pass fed the first pass's argmax (greedy feedback): the task still reaches every layer
    class Feedback(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.first, self.embed, self.second = nn.Linear(12, 3), nn.Embedding(3, 12), nn.Linear(12, 3)

        def forward(self, x):
            scores = self.first(x)
            return scores + self.second(x + self.embed(scores.argmax(-1)))

    assert not cut(Feedback(), lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]))


class TabularVAE(nn.Module):
    """A VAE over tabular rows whose latent is drawn one of four ways."""

    def __init__(self, draw: str):
        super().__init__()
        torch.manual_seed(0)
        self.draw = draw
        self.encoder = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))
        self.decoder = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 12))

    def forward(self, x):
        mu, logvar = self.encoder(x).chunk(2, -1)
        std = torch.exp(0.5 * logvar)
        if self.draw == "sample":
            z = torch.distributions.Normal(mu, std).sample()
        elif self.draw == "normal":
            z = torch.normal(mu, std)
        else:
            z = torch.distributions.Normal(mu, std).rsample()
            if self.draw == "rsample_and_a_logged_sample":
                with torch.no_grad():
                    self.spread = torch.distributions.Normal(mu, std).sample().std()
        return self.decoder(z), mu, logvar


def elbo(model, batch):
    x = batch[0]
    reconstruction, mu, logvar = model(x)
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.shape[0]
    return F.mse_loss(reconstruction, x, reduction="sum") / x.shape[0] + kl


@pytest.mark.parametrize("draw,fires", [("sample", "Distribution.sample()"), ("normal", "torch.normal()"),
                                        ("rsample", None), ("rsample_and_a_logged_sample", None)])
def test_a_latent_drawn_without_the_reparameterisation_trick(draw, fires):
    found = cut(TabularVAE(draw), elbo)
    assert bool(found) == bool(fires)
    if found:
        (issue,) = found
        assert f"through a random draw, {fires}" in issue.message and "encoder.0.weight" in issue.message
        assert "decoder" not in issue.message.split("(")[1].split(")")[0]
        assert "rsample()" in issue.fix and "mu + std * torch.randn_like(std)" in issue.fix


class TwoHeads(nn.Module):
    """A shared encoder, a main head and a second head; ``detached`` names the head that reads h.detach()."""

    def __init__(self, detached: str):
        super().__init__()
        torch.manual_seed(0)
        self.detached = detached
        self.shared = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.main, self.second = nn.Linear(16, 3), nn.Linear(16, 1)

    def forward(self, x):
        h = self.shared(x)
        return (self.main(h.detach() if self.detached == "main" else h),
                self.second(h.detach() if self.detached == "second" else h).squeeze(-1))


def main_then_second(model, batch):
    x, y = batch
    logits, extra = model(x)
    return F.cross_entropy(logits, y) + 0.5 * F.mse_loss(extra, x[:, 0])


class Gan(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 12))
        self.discriminator = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        fake = self.generator(torch.randn(len(x), 4))
        return self.discriminator(x), self.discriminator(fake.detach()), self.discriminator(fake)


def gan_loss(model, batch):
    real, fake_for_d, fake_for_g = model(batch[0])
    ones, zeros = torch.ones_like(real), torch.zeros_like(real)
    d_loss = F.binary_cross_entropy_with_logits(real, ones) + F.binary_cross_entropy_with_logits(fake_for_d, zeros)
    return d_loss + F.binary_cross_entropy_with_logits(fake_for_g, ones)


def gan_loss_discriminator_frozen(model, batch):
    """The generator's term with the discriminator frozen for it: its loss reaches the generator only."""
    real = batch[0]
    fake = model.generator(torch.randn(len(real), 4))
    d_real, d_fake = model.discriminator(real), model.discriminator(fake.detach())
    ones, zeros = torch.ones_like(d_real), torch.zeros_like(d_real)
    d_loss = F.binary_cross_entropy_with_logits(d_real, ones) + F.binary_cross_entropy_with_logits(d_fake, zeros)
    model.discriminator.requires_grad_(False)
    g_logits = model.discriminator(fake)
    model.discriminator.requires_grad_(True)
    return d_loss + F.binary_cross_entropy_with_logits(g_logits, ones)


@pytest.mark.parametrize("model,loss,fires", [(lambda: TwoHeads("main"), main_then_second, True),
                                              (lambda: TwoHeads("second"), main_then_second, False),
                                              (Gan, gan_loss, False), (Gan, gan_loss_discriminator_frozen, False)],
                         ids=["main_head_detached", "probe_detached", "gan_fakes_detached_for_d",
                              "gan_discriminator_frozen_for_g"])
def test_a_main_head_on_a_detached_encoder(model, loss, fires):
    found = cut(model(), loss)
    assert bool(found) == fires
    if found:
        (issue,) = found
        assert "shared.0.weight" in issue.message and "only through a .detach()" in issue.message
        assert "(mse_loss)" in issue.message and "aux_head(h.detach())" in issue.fix
