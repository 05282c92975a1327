"""Shapes: broadcasting and reduction axes inside the ELBO, the flow NLL, the mixture likelihood and the relaxation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from benchmarks.blind_preflight_bh.common import (
    D, MDN, N_TRAIN, VAE, Flow, adam, base_logp, bin_loaders, flow_loaders, flow_nll, kl_normal, loader, mdn_data,
    mdn_logp, mdn_nll, protos, recon_bce, recon_mse, seed)
from benchmarks.blind_preflight_bh.registry import register


class RowDataset(Dataset):
    def __init__(self, x, fixed):
        self.x, self.fixed = x, fixed

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return (self.x[i],) if self.fixed else (self.x[i:i + 1],)   # the bug: a (1, D) row instead of (D,)


@register("gauss_vae_recon_broadcast", "shapes",
          "The Dataset returns each row as a (1, D) slice, so the batch is (B, 1, D) and F.mse_loss against the "
          "decoder's (B, D) output broadcasts to (B, B, D): every reconstruction is scored against every input in "
          "the batch and the decoder learns the batch mean.",
          r"(broadcast|\(B, ?B, ?D\)|\(B, ?1, ?D\)|x\[i:i ?\+ ?1\]|extra (singleton )?dim|every (input|row|sample) in the batch|"
          r"pairwise|cross.?product|batch mean).*(recon|mse|decoder|VAE|autoencod)|(recon|mse|decoder|VAE|autoencod).*"
          r"(broadcast|\(B, ?B, ?D\)|\(B, ?1, ?D\)|x\[i:i ?\+ ?1\]|extra (singleton )?dim|every (input|row|sample) in the "
          r"batch|pairwise|batch mean)",
          recon_mse, "val recon MSE")
def gauss_vae_recon_broadcast(fixed=False):
    seed(0)
    x, _ = protos(N_TRAIN + 400, continuous=True)
    tr, va = loader(RowDataset(x[:N_TRAIN], fixed), 64), loader(RowDataset(x[N_TRAIN:], True), 200, shuffle=False)
    model = VAE(flatten=True)

    def loss_fn(m, batch):
        xb = batch[0]
        out, mu, logvar = m(xb)
        rec = F.mse_loss(out, xb, reduction="none").sum(-1).mean()
        return rec + 0.1 * kl_normal(mu, logvar).mean()
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


@register("flow_base_logprob_sum_over_batch", "shapes",
          "The flow's base log-probability is summed over the whole batch (a scalar) and then added to the per-sample "
          "log-det-Jacobian before .mean(), so the base term is weighted batch-size times more than the log-det and "
          "the flow contracts the data.",
          r"(base|prior|log.?prob|log_?p|gaussian).*(sum(med)? over (the )?(whole |entire )?batch|scalar|batch.?size "
          r"times|weighted .*(B|batch)|sum\(\)|instead of (per.?sample|dim(ension)?=?1|sum\(1\)))|"
          r"(log.?det|jacobian).*(under.?weight|outweigh|B times|batch.?size times)|sum\(1\) .*base",
          flow_nll, "val NLL/dim")
def flow_base_logprob_sum_over_batch(fixed=False):
    seed(0)
    tr, va = flow_loaders()
    model = Flow()

    def loss_fn(m, batch):
        z, logdet = m(batch[0])
        logp = base_logp(z) if fixed else base_logp(z).sum()     # the bug: summed over the batch too
        return -(logp + logdet).mean() / 2
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


@register("mdn_logsumexp_over_batch", "shapes",
          "The mixture density loss takes torch.logsumexp over dim=0 (the batch) instead of dim=1 (the mixture "
          "components), so the likelihood mixes different samples and never marginalises the components per sample.",
          r"logsumexp.*(dim ?= ?0|batch (axis|dim)|wrong (axis|dim)|over (the )?(batch|samples))|"
          r"(over|across) (the )?(batch|samples).*(instead of|rather than|not) .*(component|mixture)|"
          r"(component|mixture).*(dim ?= ?1|axis ?1).*logsumexp",
          mdn_nll, "val NLL")
def mdn_logsumexp_over_batch(fixed=False):
    seed(0)
    (x, t), (xv, tv) = mdn_data()
    from torch.utils.data import TensorDataset
    model = MDN()

    def loss_fn(m, batch):
        logits, mu, sigma = m(batch[0])
        comp = -0.5 * ((batch[1] - mu) / sigma) ** 2 - sigma.log()
        return -torch.logsumexp(F.log_softmax(logits, 1) + comp, dim=1 if fixed else 0).mean()
    return dict(model=model, optimizer=adam(model), train_loader=loader(TensorDataset(x, t), 64),
                val_loader=loader(TensorDataset(xv, tv), 200, shuffle=False), loss_fn=loss_fn)


@register("vae_kl_sum_over_batch_dim", "shapes",
          "The KL term is summed over dim=0 (the batch) instead of dim=1 (the latent units) and then averaged over "
          "the latents, so the KL is weighted batch-size / latent-size times more than the reconstruction and the "
          "posterior collapses to the prior.",
          r"KL.*(dim ?= ?0|over (the )?batch|batch (axis|dim)|wrong (axis|dim)|over.?weight|B ?/ ?Z|batch.?size ?/|"
          r"posterior collapse)|(posterior collapse|collapses? to the prior).*KL",
          recon_bce, "val recon BCE/dim")
def vae_kl_sum_over_batch_dim(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = VAE()

    def loss_fn(m, batch):
        x = batch[0]
        logits, mu, logvar = m(x)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1).mean()
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1 if fixed else 0).mean()
        return rec + kl
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=loss_fn)


class GumbelVAE(nn.Module):
    def __init__(self, groups=4, k=8, h=64, dim=-1, hard=False, tau=1.0):
        super().__init__()
        self.groups, self.k, self.dim, self.hard, self.tau = groups, k, dim, hard, tau
        self.encoder = nn.Sequential(nn.Linear(D, h), nn.ReLU(), nn.Linear(h, groups * k))
        self.decoder = nn.Sequential(nn.Linear(groups * k, h), nn.ReLU(), nn.Linear(h, D))

    def logits(self, x):
        return self.encoder(x).view(-1, self.groups, self.k)

    def forward(self, x):
        q = self.logits(x)
        z = F.gumbel_softmax(q, tau=self.tau, hard=self.hard, dim=self.dim)
        return self.decoder(z.flatten(1)), q


def gumbel_loss(m, batch):
    x = batch[0]
    out, q = m(x)
    rec = F.binary_cross_entropy_with_logits(out, x, reduction="none").sum(1).mean()
    p = F.softmax(q, -1)
    kl = (p * (F.log_softmax(q, -1) + torch.log(torch.tensor(float(m.k))))).sum((1, 2)).mean()
    return rec + kl


def gumbel_hard_recon(model, kw):
    """Held-out BCE per dimension decoding the one-hot argmax category of each latent group."""
    from benchmarks.blind_preflight_bh.common import mean_over

    def fn(m, b):
        x = b[0]
        z = F.one_hot(m.logits(x).argmax(-1), m.k).float()
        return F.binary_cross_entropy_with_logits(m.decoder(z.flatten(1)), x, reduction="sum").item(), x.numel()
    return mean_over(model, kw["val_loader"], fn)


@register("gumbel_softmax_wrong_dim", "shapes",
          "F.gumbel_softmax is applied with dim=1 on (B, groups, categories) logits, so the relaxation normalises "
          "across the latent groups instead of across each group's categories and the codes are never one-hot "
          "categorical samples.",
          r"gumbel.?softmax.*(dim ?= ?1|wrong (axis|dim)|groups|across .*(group|latent))|"
          r"(relax|normali[sz]).*(across|over) (the )?(latent )?groups|(categor).*dim ?= ?-1.*gumbel",
          gumbel_hard_recon, "val hard-code recon BCE/dim")
def gumbel_softmax_wrong_dim(fixed=False):
    seed(0)
    tr, va = bin_loaders()
    model = GumbelVAE(dim=-1 if fixed else 1)
    return dict(model=model, optimizer=adam(model), train_loader=tr, val_loader=va, loss_fn=gumbel_loss)
