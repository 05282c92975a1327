"""Mechanics: annealing, autoregressive masks and causal padding, flow permutations, log-det sign."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_bh.common import (
    MADE, V, VAE, Flow, adam, base_logp, bin_loaders, flow_loaders, flow_loss, flow_nll, honest_made_nll,
    honest_next_token_nll, kl_normal, loader, made_loss, neg_elbo, seed, tokens)
from benchmarks.blind_preflight_bh.registry import register


class AnnealedELBO:
    """Negative ELBO with a linear KL warm-up over ``warmup`` calls."""

    def __init__(self, warmup, fixed):
        self.warmup, self.fixed, self.step = warmup, fixed, 0

    def __call__(self, m, batch):
        x = batch[0]
        logits, mu, logvar = m(x)
        beta = min(1.0, self.step / self.warmup)
        if self.fixed:
            self.step += 1
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1).mean()
        return rec + beta * kl_normal(mu, logvar).mean()


@register("kl_annealing_never_advances", "mechanics",
          "The KL warm-up's step counter is never incremented, so beta = step / warmup stays 0 for the whole run and "
          "the VAE is trained as a plain autoencoder with no KL term.",
          r"(anneal|warm.?up|beta|kl weight).*(never (incremented|advanced|updated|increases)|stays? (at )?(0|zero)|"
          r"stuck at (0|zero)|counter|always (0|zero))|(counter|step).*(never incremented|not incremented)",
          neg_elbo, "val negative ELBO/dim")
def kl_annealing_never_advances(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = VAE(z=8)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va,
                loss_fn=AnnealedELBO(100, fixed))


@register("made_output_mask_non_strict", "mechanics",
          "MADE's output-layer mask uses degree >= instead of the strict >, so output d is connected to hidden units "
          "of degree d that see input x_d itself and the model learns to copy x_d rather than predict it from x_<d.",
          r"(output|last).*(mask).*(>=|non.?strict|strict|not strict|greater.?or.?equal)|(>=|non.?strict).*(mask|degree)|"
          r"(sees?|leak\w*|depends? on|copy|connected to).*(own input|x_?d\b|itself|current (input|dimension))|"
          r"autoregressive (property|mask) (is )?(broken|violated)",
          honest_made_nll, "val causal NLL/dim")
def made_output_mask_non_strict(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = MADE(strict_output=fixed)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=made_loss)


class CausalConvLM(nn.Module):
    def __init__(self, h=48, k=3, fixed=True):
        super().__init__()
        self.fixed = fixed
        self.emb = nn.Embedding(V, h)
        self.c1 = nn.Conv1d(h, h, k, padding=k - 1)
        self.c2 = nn.Conv1d(h, h, k, padding=k - 1)
        self.out = nn.Linear(h, V)

    def trim(self, y, n):
        return y[..., :n] if self.fixed else y[..., -n:]       # the bug: keeps the positions that see the future

    def forward(self, x):
        n = x.shape[1]
        h = self.emb(x).transpose(1, 2)
        h = torch.relu(self.trim(self.c1(h), n))
        h = torch.relu(self.trim(self.c2(h), n))
        return self.out(h.transpose(1, 2))


def lm_loss(m, batch):
    seq = batch[0]
    return F.cross_entropy(m(seq[:, :-1]).reshape(-1, V), seq[:, 1:].reshape(-1))


@register("causal_conv_trims_wrong_end", "mechanics",
          "The causal Conv1d pads k-1 on both sides and then keeps the last L outputs ([..., -L:]) instead of the "
          "first L ([..., :L]), so each position's output sees k-1 future tokens and the teacher-forced model peeks "
          "at the tokens it must predict.",
          r"(trim|slice|crop|keeps?).*(wrong (end|side)|last|-L:|\[\.\.\., ?-)|(causal|conv).*(future|peek|leak|"
          r"look.?ahead|not causal|non.?causal)|(future|later) tokens?.*(leak|visible|peek|see)|padding.*both sides",
          honest_next_token_nll, "val causal next-token NLL")
def causal_conv_trims_wrong_end(fixed=False):
    seed(0)
    x = tokens(1600)
    tr, va = loader(TensorDataset(x[:1200]), 32), loader(TensorDataset(x[1200:]), 200, shuffle=False)
    model = CausalConvLM(fixed=fixed)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=lm_loss)


@register("flow_no_permutation_between_couplings", "mechanics",
          "Every affine coupling layer conditions on the same first half and transforms the same second half (no "
          "permutation or flip between couplings), so the first coordinate is never transformed and keeps a plain "
          "standard-normal density.",
          r"(permut|flip|swap|alternat|reverse).*(between|across)? ?(the )?(coupling|layers)|"
          r"(same half|same (dimension|coordinate)s?).*(every|each|all) coupling|(first|one) (half|coordinate|dimension)"
          r".*never (transformed|updated|changed)|coupling.*(no|without|missing) (permutation|flip|swap)",
          flow_nll, "val NLL/dim")
def flow_no_permutation_between_couplings(fixed=False):
    seed(0)
    tr, va = flow_loaders(swap=True)          # the non-Gaussian coordinate comes first
    model = Flow(permute=fixed)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=flow_loss)


@register("flow_logdet_sign_flipped", "mechanics",
          "The flow's NLL puts the log-det-Jacobian in with the wrong sign (-(log p(z) - logdet) instead of adding it), so the "
          "change-of-variables term rewards contracting the data and the density is badly miscalibrated.",
          r"(log.?det|jacobian).*(sign|subtract|minus|negat|flipped|wrong direction)|sign.*(log.?det|jacobian)|"
          r"change.?of.?variables.*(sign|subtract)",
          flow_nll, "val NLL/dim")
def flow_logdet_sign_flipped(fixed=False):
    seed(0)
    tr, va = flow_loaders()
    model = Flow()

    def loss_fn(m, batch):
        z, logdet = m(batch[0])
        return -(base_logp(z) + (logdet if fixed else -logdet)).mean() / 2
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)
