"""Shared data, models and metrics of set bh (seeded synthetic data, tiny models)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight.registry import gen, loader, mean_over, seed  # noqa: F401

D = 16          # binary / continuous vector size
N_TRAIN, N_VAL = 2000, 400
LR = 3e-3


def protos(n: int, s: int = 0, k: int = 8, flip: float = 0.06, continuous: bool = False):
    """Binary vectors near k prototypes (or continuous ones with Gaussian noise) and their prototype labels."""
    g = gen(100)
    p = (torch.rand(k, D, generator=g) < 0.5).float()
    g = gen(s)
    lab = torch.randint(0, k, (n,), generator=g)
    x = p[lab]
    if continuous:
        return (x * 2 - 1) + 0.2 * torch.randn(n, D, generator=g), lab
    f = (torch.rand(n, D, generator=g) < flip).float()
    return (x + f) % 2, lab


def banana(n: int, s: int = 0):
    g = gen(s)
    a = torch.randn(n, generator=g)
    b = 0.5 * a ** 2 - 1 + 0.3 * torch.randn(n, generator=g)
    return torch.stack([a, b], 1)


def inverse_sine(n: int, s: int = 0):
    """Bishop's multi-valued inverse problem: predict t from x = t + 0.3 sin(2 pi t) + noise."""
    g = gen(s)
    t = torch.rand(n, 1, generator=g)
    x = t + 0.3 * torch.sin(2 * math.pi * t) + 0.1 * (torch.rand(n, 1, generator=g) - 0.5)
    return (x - 0.5) * 2, (t - 0.5) * 2


def tokens(n: int, s: int = 0, length: int = 12, vocab: int = 13):
    g = gen(s)
    start = torch.randint(0, vocab - 3, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    return (start + step * torch.arange(length)) % (vocab - 3) + 3


# ----------------------------------------------------------------------------------------------------- VAEs
class VAE(nn.Module):
    def __init__(self, z: int = 4, h: int = 64, cond: int = 0, flatten: bool = False):
        super().__init__()
        self.cond, self.flatten = cond, flatten
        self.encoder = nn.Sequential(nn.Linear(D + cond, h), nn.ReLU())
        self.fc_mu, self.fc_logvar = nn.Linear(h, z), nn.Linear(h, z)
        self.decoder = nn.Sequential(nn.Linear(z + cond, h), nn.ReLU(), nn.Linear(h, D))

    def encode(self, x, c=None):
        if self.flatten:
            x = x.flatten(1)
        h = self.encoder(x if c is None else torch.cat([x, c], 1))
        return self.fc_mu(h), self.fc_logvar(h)

    def decode(self, z, c=None):
        return self.decoder(z if c is None else torch.cat([z, c], 1))

    def forward(self, x, c=None):
        mu, logvar = self.encode(x, c)
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        return self.decode(z, c), mu, logvar


def kl_normal(mu, logvar):
    """KL(q(z|x) || N(0, I)) per sample."""
    return -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1)


def recon_bce(model, kw):
    """Held-out Bernoulli reconstruction NLL per dimension, decoding the posterior mean."""
    def fn(m, b):
        x = b[0]
        mu, _ = m.encode(x)
        return F.binary_cross_entropy_with_logits(m.decode(mu), x, reduction="sum").item(), x.numel()
    return mean_over(model, kw["val_loader"], fn)


def recon_mse(model, kw):
    def fn(m, b):
        x = b[0].reshape(len(b[0]), D)
        mu, _ = m.encode(x)
        return ((m.decode(mu) - x) ** 2).sum().item(), x.numel()
    return mean_over(model, kw["val_loader"], fn)


def neg_elbo(model, kw):
    """Held-out negative ELBO per dimension (Bernoulli decoder, one posterior sample)."""
    torch.manual_seed(0)

    def fn(m, b):
        x = b[0]
        logits, mu, logvar = m(x)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="sum")
        return (rec + kl_normal(mu, logvar).sum()).item(), x.numel()
    return mean_over(model, kw["val_loader"], fn)


def cond_prior_bce(model, kw):
    """Held-out BCE per dimension of the conditional decoder at the prior mean z = 0 given the true label."""
    def fn(m, b):
        x, y = b[0], b[1]
        c = F.one_hot(y, 8).float()
        z = torch.zeros(len(x), m.fc_mu.out_features)
        return F.binary_cross_entropy_with_logits(m.decode(z, c), x, reduction="sum").item(), x.numel()
    return mean_over(model, kw["val_loader"], fn)


def bin_loaders(batch=64, s=0, labels=False):
    x, y = protos(N_TRAIN + N_VAL, s)
    tr = TensorDataset(x[:N_TRAIN], y[:N_TRAIN]) if labels else TensorDataset(x[:N_TRAIN])
    va = TensorDataset(x[N_TRAIN:], y[N_TRAIN:]) if labels else TensorDataset(x[N_TRAIN:])
    return loader(tr, batch), loader(va, 200, shuffle=False)


# ---------------------------------------------------------------------------------------------------- flows
class Coupling(nn.Module):
    def __init__(self, flip: bool, h: int = 32):
        super().__init__()
        self.flip = flip
        self.net = nn.Sequential(nn.Linear(1, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, 2))

    def forward(self, x):
        a, b = (x[:, 1:], x[:, :1]) if self.flip else (x[:, :1], x[:, 1:])
        st = self.net(a)
        s, t = 2 * torch.tanh(st[:, :1] / 2), st[:, 1:]
        b = b * torch.exp(s) + t
        out = torch.cat([b, a], 1) if self.flip else torch.cat([a, b], 1)
        return out, s.sum(1)


class Flow(nn.Module):
    """Affine couplings from data x to base z; forward returns (z, log|det dz/dx|)."""

    def __init__(self, n: int = 6, permute: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(Coupling(flip=permute and i % 2 == 1) for i in range(n))

    def forward(self, x):
        logdet = torch.zeros(len(x))
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        return x, logdet


def base_logp(z):
    return (-0.5 * z ** 2 - 0.5 * math.log(2 * math.pi)).sum(1)


def flow_nll(model, kw):
    """Held-out NLL per dimension (nats) of the flow's density."""
    def fn(m, b):
        z, ld = m(b[0])
        return -(base_logp(z) + ld).sum().item(), b[0].numel()
    return mean_over(model, kw["val_loader"], fn)


def flow_loss(model, batch):
    z, logdet = model(batch[0])
    return -(base_logp(z) + logdet).mean() / 2


def flow_loaders(s=0, swap=False):
    x = banana(N_TRAIN + N_VAL, s)
    if swap:
        x = x.flip(1)
    return loader(TensorDataset(x[:N_TRAIN]), 64), loader(TensorDataset(x[N_TRAIN:]), 200, shuffle=False)


# ------------------------------------------------------------------------------------------------------ MDN
class MDN(nn.Module):
    def __init__(self, k: int = 5, h: int = 32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh())
        self.pi_head, self.mu_head, self.sigma_head = nn.Linear(h, k), nn.Linear(h, k), nn.Linear(h, k)

    def forward(self, x):
        h = self.body(x)
        return self.pi_head(h), self.mu_head(h), F.softplus(self.sigma_head(h)) + 1e-3


def mdn_logp(out, y):
    """Per-sample log-likelihood of y (B, 1) under the mixture: logsumexp over the K components."""
    logits, mu, sigma = out
    comp = -0.5 * ((y - mu) / sigma) ** 2 - sigma.log() - 0.5 * math.log(2 * math.pi)
    return torch.logsumexp(F.log_softmax(logits, 1) + comp, dim=1)


def mdn_loss(model, batch):
    x, y = batch
    return -mdn_logp(model(x), y).mean()


def mdn_nll(model, kw):
    def fn(m, b):
        return -mdn_logp(m(b[0]), b[1]).sum().item(), len(b[0])
    return mean_over(model, kw["val_loader"], fn)


def mdn_data(s=0):
    x, t = inverse_sine(N_TRAIN + N_VAL, s)
    return (x[:N_TRAIN], t[:N_TRAIN]), (x[N_TRAIN:], t[N_TRAIN:])


# ----------------------------------------------------------------------------------------- autoregressive
V = 13


class GRULM(nn.Module):
    def __init__(self, h: int = 48, channels_first: bool = False):
        super().__init__()
        self.channels_first = channels_first
        self.emb, self.gru, self.out = nn.Embedding(V, h), nn.GRU(h, h, batch_first=True), nn.Linear(h, V)

    def forward(self, x):
        o = self.out(self.gru(self.emb(x))[0])
        return o.transpose(1, 2) if self.channels_first else o


def next_token_nll(model, kw):
    """Held-out next-token NLL: logits of model(x[:, :-1]) scored against x[:, 1:]."""
    def fn(m, b):
        x = b[0]
        o = m(x[:, :-1])
        if o.shape[1] == V and o.shape[2] != V:
            o = o.transpose(1, 2)
        return F.cross_entropy(o.reshape(-1, V), x[:, 1:].reshape(-1), reduction="sum").item(), x[:, 1:].numel()
    return mean_over(model, kw["val_loader"], fn)


def honest_next_token_nll(model, kw):
    """Next-token NLL where, for each position t, every input after t is blanked (id 0): a causal model scores the
    same as with the full input; a model that peeks at later tokens loses what it peeked at."""
    def fn(m, b):
        inp, tgt = b[0][:, :-1], b[0][:, 1:]
        total = 0.0
        for t in range(inp.shape[1]):
            xi = inp.clone()
            xi[:, t + 1:] = 0
            total += F.cross_entropy(m(xi)[:, t], tgt[:, t], reduction="sum").item()
        return total, tgt.numel()
    return mean_over(model, kw["val_loader"], fn)


def token_loaders(s=0, **kw):
    x = tokens(1600, s)
    return loader(TensorDataset(x[:1200]), 32, **kw), loader(TensorDataset(x[1200:]), 200, shuffle=False)


class MaskedLinear(nn.Linear):
    def __init__(self, i, o, mask, as_parameter=False):
        super().__init__(i, o)
        if as_parameter:
            self.mask = nn.Parameter(mask.float())
        else:
            self.register_buffer("mask", mask.float())

    def forward(self, x):
        return F.linear(x, self.weight * self.mask, self.bias)


class MADE(nn.Module):
    def __init__(self, h: int = 64, strict_output: bool = True, mask_param: bool = False):
        super().__init__()
        g = gen(7)
        m_in = torch.arange(1, D + 1)
        m_h1 = torch.randint(1, D, (h,), generator=g)
        m_h2 = torch.randint(1, D, (h,), generator=g)
        out_mask = (m_in[:, None] > m_h2[None, :]) if strict_output else (m_in[:, None] >= m_h2[None, :])
        self.net = nn.Sequential(
            MaskedLinear(D, h, m_h1[:, None] >= m_in[None, :], mask_param), nn.ReLU(),
            MaskedLinear(h, h, m_h2[:, None] >= m_h1[None, :], mask_param), nn.ReLU(),
            MaskedLinear(h, D, out_mask, mask_param))

    def forward(self, x):
        return self.net(x)


def made_loss(model, batch):
    x = batch[0]
    return F.binary_cross_entropy_with_logits(model(x), x)


def honest_made_nll(model, kw):
    """NLL per dimension where the logit of dimension d is computed with dimensions >= d blanked (0)."""
    def fn(m, b):
        x = b[0]
        total = 0.0
        for d in range(D):
            xi = x.clone()
            xi[:, d:] = 0
            total += F.binary_cross_entropy_with_logits(m(xi)[:, d], x[:, d], reduction="sum").item()
        return total, x.numel()
    return mean_over(model, kw["val_loader"], fn)


def adam(model, lr=LR):
    return torch.optim.Adam(model.parameters(), lr=lr)
