"""Healthy: five corrected twins and five unusual but correct setups of the domain."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bh import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_bh.common import (
    D, GRULM, V, VAE, Flow, adam, base_logp, bin_loaders, flow_loaders, gen, kl_normal, loader, seed, tokens)
from benchmarks.blind_preflight_bh.registry import healthy, twin

for _builder in (cases_shapes.flow_base_logprob_sum_over_batch, cases_targets.ar_targets_not_shifted,
                 cases_trained.vq_no_straight_through, cases_mechanics.made_output_mask_non_strict,
                 cases_data.cvae_labels_off_by_one):
    healthy(_builder.__name__ + "_fixed", "corrected twin of " + _builder.__name__)(twin(_builder))


@healthy("vae_free_bits", "Bernoulli VAE whose KL is clamped per latent unit at 0.25 nats (free bits).")
def vae_free_bits():
    seed(0)
    tr, va = bin_loaders()
    model = VAE(z=8)

    def loss_fn(m, batch):
        x = batch[0]
        logits, mu, logvar = m(x)
        kl_dim = (-0.5 * (1 + logvar - mu ** 2 - logvar.exp())).mean(0)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1).mean()
        return rec + torch.clamp(kl_dim, min=0.25).sum()
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


class Hetero(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 32), nn.Tanh())
        self.mean, self.logvar = nn.Linear(32, 1), nn.Linear(32, 1)

    def forward(self, x):
        h = self.body(x)
        return self.mean(h), self.logvar(h)


@healthy("heteroscedastic_gaussian_nll", "A one-component density network (mean and log-variance heads) trained "
         "with F.gaussian_nll_loss on noise whose scale grows with x.")
def heteroscedastic_gaussian_nll():
    seed(0)
    g = gen(5)
    x = torch.rand(2400, 1, generator=g) * 2 - 1
    y = torch.sin(2 * x) + (0.05 + 0.3 * (x + 1)) * torch.randn(2400, 1, generator=g)
    model = Hetero()

    def loss_fn(m, batch):
        mean, logvar = m(batch[0])
        return F.gaussian_nll_loss(mean, batch[1], logvar.exp())
    return dict(model=model, optimizer=adam(model), train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False), loss_fn=loss_fn)


@healthy("gumbel_hard_straight_through", "Categorical VAE with F.gumbel_softmax(hard=True, tau=0.5, dim=-1): one-hot "
         "forward samples with straight-through gradients.")
def gumbel_hard_straight_through():
    seed(0)
    tr, va = bin_loaders()
    model = cases_shapes.GumbelVAE(hard=True, tau=0.5)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=cases_shapes.gumbel_loss)


class BOSCollate:
    def __call__(self, rows):
        seq = torch.stack([r[0] for r in rows])
        bos = torch.ones(len(seq), 1, dtype=seq.dtype)        # id 1 is a begin-of-sequence token
        return torch.cat([bos, seq[:, :-1]], 1), seq


@healthy("ar_gru_bos_collate", "Teacher-forced GRU whose collate_fn prepends a BOS id to the inputs and keeps the "
         "whole sequence as targets (the shift is done by the BOS).")
def ar_gru_bos_collate():
    seed(0)
    x = tokens(1600)
    tr = loader(TensorDataset(x[:1200]), 32, collate_fn=BOSCollate())
    va = loader(TensorDataset(x[1200:]), 200, shuffle=False, collate_fn=BOSCollate())
    model = GRULM(channels_first=True)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss())


class ScaledFlow(Flow):
    """Couplings followed by a learned per-dimension log-scale whose log-det is added."""

    def __init__(self):
        super().__init__(n=4)
        self.log_scale = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        z, logdet = super().forward(x)
        return z * self.log_scale.exp(), logdet + self.log_scale.sum()


@healthy("flow_with_learned_output_scale", "Coupling flow ending in a learned elementwise scale layer whose "
         "log-det (sum of log-scales) is included in the NLL.")
def flow_with_learned_output_scale():
    seed(0)
    tr, va = flow_loaders(1)
    model = ScaledFlow()

    def loss_fn(m, batch):
        z, logdet = m(batch[0])
        return -(base_logp(z) + logdet).mean() / 2
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)
