"""What is trained: which parameters the optimizer updates and which terms send gradient where."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bh.common import (
    D, MADE, MDN, VAE, Flow, adam, base_logp, bin_loaders, flow_loaders, flow_nll, honest_made_nll, kl_normal,
    loader, made_loss, mdn_data, mdn_loss, mdn_nll, mean_over, recon_bce, seed, LR)
from benchmarks.blind_preflight_bh.registry import register


@register("vae_optimizer_misses_decoder", "what_is_trained",
          "The Adam optimizer is built from model.encoder, fc_mu and fc_logvar parameters only, so the VAE's decoder "
          "keeps its random initial weights and the encoder is trained against a fixed random decoder.",
          r"decoder.*(not (in|passed to|given to|handed to) the optimi[sz]er|never (updated|trained|optimi[sz]ed)|"
          r"random (init|initial)|left out|missing|omitted|excluded|fixed)|optimi[sz]er.*(omit|miss|exclud|lack|without)"
          r".*decoder",
          recon_bce, "val recon BCE/dim")
def vae_optimizer_misses_decoder(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = VAE()

    def loss_fn(m, batch):
        x = batch[0]
        logits, mu, logvar = m(x)
        return F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1).mean() + \
            kl_normal(mu, logvar).mean()
    params = list(model.parameters()) if fixed else \
        [*model.encoder.parameters(), *model.fc_mu.parameters(), *model.fc_logvar.parameters()]
    return dict(model=model, optimizer=torch.optim.Adam(params, lr=LR), train_loader=tr, val_loader=va,
                loss_fn=loss_fn)


@register("flow_logdet_detached", "what_is_trained",
          "The coupling flow's log-det-Jacobian is .detach()ed in the NLL, so its value is reported but no gradient "
          "resists the base log-probability and the scales shrink the data towards the origin.",
          r"(log.?det|jacobian).*(detach|no grad|stop.?grad|without grad|not differentiat|cut from the graph)|"
          r"detach.*(log.?det|jacobian)",
          flow_nll, "val NLL/dim")
def flow_logdet_detached(fixed=False):
    seed(0)
    tr, va = flow_loaders()
    model = Flow()

    def loss_fn(m, batch):
        z, logdet = m(batch[0])
        return -(base_logp(z) + (logdet if fixed else logdet.detach())).mean() / 2
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


class VQVAE(nn.Module):
    def __init__(self, k=16, zd=4, h=64, straight_through=True):
        super().__init__()
        self.straight_through = straight_through
        self.encoder = nn.Sequential(nn.Linear(D, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, zd), nn.Tanh())
        self.codebook = nn.Embedding(k, zd)
        self.codebook.weight.data.uniform_(-1, 1)
        self.decoder = nn.Sequential(nn.Linear(zd, h), nn.ReLU(), nn.Linear(h, D))

    def quantise(self, ze):
        idx = torch.cdist(ze, self.codebook.weight).argmin(1)
        return self.codebook(idx)

    def forward(self, x):
        ze = self.encoder(x)
        zq = self.quantise(ze)
        zst = ze + (zq - ze).detach() if self.straight_through else zq
        return self.decoder(zst), ze, zq


def vq_loss(m, batch):
    x = batch[0]
    out, ze, zq = m(x)
    rec = F.binary_cross_entropy_with_logits(out, x, reduction="none").sum(1).mean()
    return rec + F.mse_loss(zq, ze.detach()) + 0.25 * F.mse_loss(ze, zq.detach())


def vq_recon(model, kw):
    def fn(m, b):
        out, _, _ = m(b[0])
        return F.binary_cross_entropy_with_logits(out, b[0], reduction="sum").item(), b[0].numel()
    return mean_over(model, kw["val_loader"], fn)


@register("vq_no_straight_through", "what_is_trained",
          "The VQ-VAE feeds the quantised codebook vectors z_q to the decoder without the straight-through estimator "
          "z_e + (z_q - z_e).detach(), so the reconstruction loss sends no gradient to the encoder, which is trained "
          "only by the commitment term.",
          r"straight.?through|z_?e ?\+ ?\(z_?q ?- ?z_?e\)\.detach|(encoder).*(no|never|without) (reconstruction )?"
          r"grad(ient)?.*(recon|decoder)|(recon\w*|decoder).*(no|never|without).*grad(ient)?.*encoder|"
          r"argmin.*not differentiable",
          vq_recon, "val recon BCE/dim")
def vq_no_straight_through(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = VQVAE(straight_through=fixed)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=vq_loss)


class SampledVAE(VAE):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed

    def forward(self, x, c=None):
        mu, logvar = self.encode(x, c)
        q = torch.distributions.Normal(mu, torch.exp(0.5 * logvar))
        z = q.rsample() if self.fixed else q.sample()      # the bug: .sample() is not differentiable
        return self.decode(z, c), mu, logvar


@register("vae_sample_instead_of_rsample", "what_is_trained",
          "The VAE draws its latent with torch.distributions.Normal(mu, std).sample() instead of .rsample(), so the "
          "sample carries no gradient and the encoder is trained only by the KL term, which pulls it to the prior.",
          r"rsample|reparameteri[sz]\w*.*(missing|not used|bypass|without|instead)|\.sample\(\).*(no grad|not "
          r"differentiable|detach|cut)|(encoder).*(only|no gradient).*(KL|reconstruction)",
          recon_bce, "val recon BCE/dim")
def vae_sample_instead_of_rsample(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = SampledVAE(fixed)

    def loss_fn(m, batch):
        x = batch[0]
        logits, mu, logvar = m(x)
        return F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1).mean() + \
            kl_normal(mu, logvar).mean()
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


@register("made_mask_is_parameter", "what_is_trained",
          "MADE's autoregressive masks are stored as nn.Parameter instead of a buffer, so the optimizer updates them "
          "and the zeros of the masks drift away from zero, letting each output see its own and later inputs.",
          r"mask.*(nn\.Parameter|parameter|trainable|requires_grad|updated by the optimi[sz]er|register_buffer|buffer|"
          r"learn(ed|t))",
          honest_made_nll, "val causal NLL/dim")
def made_mask_is_parameter(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = MADE(mask_param=not fixed)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=made_loss)
