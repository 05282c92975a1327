"""Targets: what the density model is asked to predict (shift, scale, dequantisation, logits vs probabilities)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bh.common import (
    GRULM, N_TRAIN, V, VAE, Flow, adam, base_logp, bin_loaders, flow_loaders, flow_loss, flow_nll, gen, kl_normal, loader, next_token_nll,
    protos, recon_bce, seed, tokens)
from benchmarks.blind_preflight_bh.registry import register


@register("ar_targets_not_shifted", "targets",
          "The teacher-forced loss scores the GRU's logits on x[:, :-1] against x[:, :-1] itself instead of the next "
          "tokens x[:, 1:], so the model learns to copy its current input rather than predict the next token.",
          r"(not shifted|unshifted|shift(ed)? by one|off.?by.?one|x\[:, ?1:\]|next.?token|same position|copy (its|the) "
          r"(current )?input|predicts? (its|the) (own|current) input|identity)",
          next_token_nll, "val next-token NLL")
def ar_targets_not_shifted(fixed=False):
    seed(0)
    x = tokens(1600)
    tr, va = loader(TensorDataset(x[:1200]), 32), loader(TensorDataset(x[1200:]), 200, shuffle=False)
    model = GRULM()

    def loss_fn(m, batch):
        seq = batch[0]
        logits = m(seq[:, :-1])
        target = seq[:, 1:] if fixed else seq[:, :-1]
        return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1))
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


@register("bce_targets_normalised_to_minus_one", "targets",
          "The binary data is normalised with (x - 0.5) / 0.5 before the Bernoulli decoder's "
          "binary_cross_entropy_with_logits, so the targets are -1 / +1 instead of 0 / 1 and the -1 pixels push "
          "every logit towards minus infinity.",
          r"(target|label|pixel)s?.{0,40}(\[-1, ?1\]|-1 ?(/|and|or) ?\+?1|minus one|-1 as a target|outside (its support|"
          r"\[?0, ?1))|(target|label|pixel)s? (were |are )?normali[sz]ed|(bernoulli|binary.?cross|BCE).*(\[-1, ?1\]|-1 as|"
          r"negative target|outside)",
          recon_bce, "val recon BCE/dim")
def bce_targets_normalised_to_minus_one(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = VAE()

    def loss_fn(m, batch):
        x = batch[0]
        target = x if fixed else (x - 0.5) / 0.5
        logits, mu, logvar = m(x)
        rec = F.binary_cross_entropy_with_logits(logits, target, reduction="none").sum(1).mean()
        return rec + kl_normal(mu, logvar).mean()
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


class ShiftCollate:
    def __init__(self, fixed):
        self.fixed = fixed

    def __call__(self, rows):
        seq = torch.stack([r[0] for r in rows])
        if self.fixed:
            return seq[:, :-1], seq[:, 1:]
        return seq[:, 1:], seq[:, :-1]          # the bug: input and target shifted the wrong way


@register("ar_collate_shift_reversed", "targets",
          "The collate_fn builds (input, target) as (seq[:, 1:], seq[:, :-1]), shifting the wrong way: the causal "
          "GRU is taught to predict the previous token from the current one instead of the next token.",
          r"(shift|offset).*(wrong (way|direction)|revers|backward|swap)|(previous|preceding) token|"
          r"seq\[:, ?1:\], ?seq\[:, ?:-1\]|(input|target)s? (and|/) (input|target)s? (are )?swapped|revers.*(input|target)",
          next_token_nll, "val next-token NLL")
def ar_collate_shift_reversed(fixed=False):
    seed(0)
    x = tokens(1600)
    tr = loader(TensorDataset(x[:1200]), 32, collate_fn=ShiftCollate(fixed))
    va = loader(TensorDataset(x[1200:]), 200, shuffle=False)
    model = GRULM(channels_first=True)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=nn.CrossEntropyLoss())


def grid_data(n, s):
    """Two-dimensional data on a 16-level grid (a discretised banana): integer levels k in [0, 16)."""
    g = gen(s)
    a = torch.randn(n, generator=g)
    b = 0.5 * a ** 2 - 1 + 0.3 * torch.randn(n, generator=g)
    x = torch.stack([a, b], 1)
    return ((x + 3) / 6 * 16).floor().clamp(0, 15)


def scale(levels):
    return (levels / 16 - 0.5) * 6


class Dequant(torch.utils.data.Dataset):
    def __init__(self, k, noise_scale):
        self.k, self.noise_scale = k, noise_scale

    def __len__(self):
        return len(self.k)

    def __getitem__(self, i):
        return (scale(self.k[i] + self.noise_scale * torch.rand(2)),)


def dequant_val():
    k = grid_data(400, 9)
    return loader(TensorDataset(scale(k + torch.rand(k.shape, generator=gen(10)))), 200, shuffle=False)


@register("flow_base_logprob_on_input", "targets",
          "The flow's NLL evaluates the base Gaussian log-probability on the data x instead of on the flow's output z "
          "(base_logp(x) + logdet), so nothing ties the latent to the base distribution and the couplings only "
          "maximise the log-det.",
          r"(base|prior|gaussian|log.?prob|log_?p).*(on|of|at) (the )?(data|input|x\b).*(instead of|rather than|not) "
          r"(on |of )?(the )?(latent|output|z\b|transformed)|base_logp\(x\)|(latent|z\b).*never (scored|evaluated|"
          r"enters)",
          flow_nll, "val NLL/dim")
def flow_base_logprob_on_input(fixed=False):
    seed(0)
    tr, va = flow_loaders()
    model = Flow()

    def loss_fn(m, batch):
        x = batch[0]
        z, logdet = m(x)
        return -(base_logp(z if fixed else x) + logdet).mean() / 2
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


@register("bernoulli_decoder_mse_on_logits", "targets",
          "The Bernoulli decoder's raw logits are regressed onto the 0/1 pixels with F.mse_loss, so the logits are "
          "pulled to 0 and 1 (probabilities 0.5 and 0.73) instead of being scored as logits with "
          "binary_cross_entropy_with_logits.",
          r"(mse|squared error|regress).*(logit|raw output|pre.?sigmoid)|logit.*(mse|regress|compared (directly )?"
          r"(to|with) the (0/1|binary))|(binary_cross_entropy_with_logits|bernoulli (likelihood|nll)).*instead of.*mse",
          recon_bce, "val recon BCE/dim")
def bernoulli_decoder_mse_on_logits(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = VAE()

    def loss_fn(m, batch):
        x = batch[0]
        logits, mu, logvar = m(x)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1).mean() if fixed else \
            F.mse_loss(logits, x, reduction="none").sum(1).mean()
        return rec + kl_normal(mu, logvar).mean()
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)
