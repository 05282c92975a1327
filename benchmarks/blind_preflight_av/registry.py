"""Set av's case registry: set a's Case / CaseTable and data helpers, its own case table, the generative and survival
data and models its cases share, their metrics, and the one-line fixes ``verify.py`` trains next to each broken case
(``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_av")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def mlp(d_in, d_out, hidden=64, depth=2):
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, hidden), nn.SiLU()]
        d = hidden
    return nn.Sequential(*layers, nn.Linear(d, d_out))


# ---------------------------------------------------------------- data

def vae_data(n=2400, d=16, k=3, s=0):
    """Points near a k-dimensional curved manifold in d dimensions (a latent code really helps)."""
    g = gen(s)
    z = torch.randn(n, k, generator=g)
    w = torch.randn(k, d, generator=g)
    x = torch.tanh(z @ w) + 0.05 * torch.randn(n, d, generator=g)
    return x


def mixture_2d(n=3000, s=0, scale=1.0):
    g = gen(s)
    centres = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    idx = torch.randint(0, 4, (n,), generator=g)
    return (centres[idx] + 0.1 * torch.randn(n, 2, generator=g)) * scale


def mixture_1d(n=3000, s=0):
    g = gen(s)
    sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return 2.0 * sign + 0.2 * torch.randn(n, generator=g)


def correlated_8d(n=3000, s=0):
    """Strongly correlated, curved 8-d data: a diagonal Gaussian fits it badly, a coupling flow well."""
    g = gen(s)
    z = torch.randn(n, 3, generator=g)
    a = torch.randn(3, 8, generator=g)
    x = z @ a + 0.3 * torch.tanh(z[:, :1]) ** 2 + 0.1 * torch.randn(n, 8, generator=g)
    return (x - x.mean(0)) / x.std(0)


def survival_data(n=2000, d=8, s=0, censor_rate=1.2, informative=False):
    """Features, observed times and event flags from an exponential model with a nonlinear log-hazard and independent
    (heavy) exponential censoring. ``informative``: follow-up is shorter for low-risk subjects (recruited later), a
    censoring that stays ignorable for the Cox likelihood given the features, but not if censored rows count as events."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) / d ** 0.5
    log_h = 1.5 * torch.tanh(x @ w) + 0.5 * x[:, 0] * x[:, 1]
    t_event = -torch.log(torch.rand(n, generator=g)) / log_h.exp()
    rate = censor_rate * (-log_h).exp() if informative else torch.full((n,), censor_rate)
    t_censor = -torch.log(torch.rand(n, generator=g)) / rate
    time = torch.minimum(t_event, t_censor)
    event = (t_event <= t_censor).float()
    return x, time, event


def person_period(n=1500, d=6, k=8, s=0, all_periods=False):
    """Discrete-time hazard data expanded to one row per subject and interval at risk: features = subject features +
    one-hot interval, label = 1 in the interval the event happens. ``all_periods``: label 1 in every interval up to
    the event (a mislabelling)."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g) * 1.2 / d ** 0.5
    base = torch.linspace(-2.5, -0.5, k)
    rows, labels = [], []
    censor_at = torch.randint(2, k + 1, (n,), generator=g)
    for i in range(n):
        for j in range(int(censor_at[i])):
            p = torch.sigmoid(base[j] + 2.0 * (x[i] @ w))
            e = float(torch.rand(1, generator=g) < p)
            rows.append(torch.cat([x[i], F.one_hot(torch.tensor(j), k).float()]))
            labels.append(e)
            if e:
                if all_periods:
                    labels[len(labels) - j - 1:] = [1.0] * (j + 1)
                break
    return torch.stack(rows), torch.tensor(labels)


# ---------------------------------------------------------------- models

class Denoiser(nn.Module):
    """eps(x_t, t): an MLP on the noisy point and a sinusoidal embedding of t / T."""

    def __init__(self, dim=2, steps=100, hidden=128, emb=16):
        super().__init__()
        self.steps, self.emb = steps, emb
        self.net = mlp(dim + emb, dim, hidden, depth=3)

    def embed(self, t):
        half = self.emb // 2
        freqs = torch.exp(torch.arange(half, device=t.device, dtype=torch.float32) * (-math.log(1000.0) / half))
        angle = (t.float() / self.steps)[:, None] * 1000.0 * freqs[None]
        return torch.cat([angle.sin(), angle.cos()], dim=-1)

    def forward(self, x_t, t):
        return self.net(torch.cat([x_t, self.embed(t)], dim=-1))


def linear_alpha_bar(steps=100, device="cpu"):
    betas = torch.linspace(1e-4, 0.05, steps, device=device)
    return torch.cumprod(1 - betas, dim=0)


class VAE(nn.Module):
    def __init__(self, d=16, latent=3, hidden=64):
        super().__init__()
        self.enc = mlp(d, 2 * latent, hidden)
        self.dec = mlp(latent, d, hidden)

    def encode(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        return mu, logvar

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(z), mu, logvar


class Coupling(nn.Module):
    def __init__(self, d, mask, hidden=64):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = mlp(d, 2 * d, hidden)

    def forward(self, x):
        s, t = self.net(x * self.mask).chunk(2, dim=-1)
        s = torch.tanh(s) * (1 - self.mask)
        t = t * (1 - self.mask)
        return x * self.mask + (1 - self.mask) * (x * s.exp() + t), s.sum(-1)


class RealNVP(nn.Module):
    """x -> z through affine couplings and an elementwise affine; forward returns (z, log|det dz/dx|)."""

    def __init__(self, d=8, layers=4, hidden=64):
        super().__init__()
        masks = [(torch.arange(d) % 2 == i % 2).float() for i in range(layers)]
        self.layers = nn.ModuleList(Coupling(d, m, hidden) for m in masks)
        self.loc = nn.Parameter(torch.zeros(d))
        self.log_scale = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        logdet = torch.zeros(x.shape[0], device=x.device)
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        z = (x - self.loc) * self.log_scale.exp()
        return z, logdet + self.log_scale.sum()


def flow_nll(model, x):
    """Per-sample negative log-likelihood (nats) of a standard-normal-base flow."""
    z, logdet = model(x)
    log_pz = -0.5 * (z ** 2).sum(-1) - 0.5 * z.shape[-1] * math.log(2 * math.pi)
    return -(log_pz + logdet)


class GAN(nn.Module):
    """Generator and discriminator in one module so one optimizer and one loss_fn drive both."""

    def __init__(self, z_dim=4, out=1, hidden=64, tanh=False):
        super().__init__()
        self.z_dim = z_dim
        g = [mlp(z_dim, out, hidden)]
        if tanh:
            g.append(nn.Tanh())
        self.G = nn.Sequential(*g)
        self.D = mlp(out, 1, hidden)
        self.out_scale = 1.0

    def forward(self, z):
        return self.G(z)


def frozen_d(model, x):
    """D(x) with D's weights detached: the generator's loss moves G only."""
    params = {k: v.detach() for k, v in model.D.named_parameters()}
    return torch.func.functional_call(model.D, params, (x,))


class Hazard(nn.Module):
    def __init__(self, d=8, hidden=32):
        super().__init__()
        self.net = mlp(d, 1, hidden)

    def forward(self, x):
        return self.net(x)


def cox_loss(log_h, time, event):
    """Negative Cox partial log-likelihood (Breslow without ties): sort by time descending, risk set by
    logcumsumexp, events only."""
    order = torch.argsort(time, descending=True)
    log_h, event = log_h.reshape(-1)[order], event[order]
    log_den = torch.logcumsumexp(log_h, dim=0)
    return -((log_h - log_den) * event).sum() / event.sum().clamp(min=1.0)


# ---------------------------------------------------------------- metrics

@torch.no_grad()
def c_index(model, kw):
    """Harrell's C on the validation loader: pairs (i, j) with event_i and time_i < time_j, higher risk for i."""
    was = model.training
    model.eval()
    xs, ts, es = [], [], []
    for x, t, e in kw["val_loader"]:
        xs.append(x)
        ts.append(t)
        es.append(e)
    x, t, e = torch.cat(xs), torch.cat(ts), torch.cat(es)
    r = model(x).reshape(-1).float()
    model.train(was)
    comparable = (t[:, None] < t[None, :]) & (e[:, None] > 0)
    concordant = (r[:, None] > r[None, :]).float() + 0.5 * (r[:, None] == r[None, :]).float()
    return float((concordant * comparable).sum() / comparable.sum())


def eps_mse_of(alpha_bar_fn=linear_alpha_bar, steps=100, dim=2):
    """Validation noise-prediction MSE under the correct schedule, fixed noise and timesteps."""
    def metric(model, kw):
        g = gen(99)

        def fn(m, b):
            x0 = b[0].reshape(b[0].shape[0], dim).float()
            t = torch.randint(0, steps, (x0.shape[0],), generator=g)
            eps = torch.randn(x0.shape, generator=g)
            ab = alpha_bar_fn(steps)[t][:, None]
            x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
            return ((m(x_t, t).reshape(eps.shape) - eps) ** 2).sum().item(), eps.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def vae_recon_mse(model, kw):
    """Validation reconstruction MSE of the decoded posterior mean (targets in [0, 1] when the loader gives 0-255)."""
    def fn(m, b):
        x = b[0].reshape(b[0].shape[0], -1).float()
        target = x / 255.0 if x.max() > 1.5 else x
        mu, _ = m.encode(x)
        recon = m.dec(mu)
        if getattr(m, "sigmoid_out", False):
            recon = torch.sigmoid(recon)
        return ((recon - target) ** 2).sum().item(), target.numel()
    return mean_over(model, kw["val_loader"], fn)


def flow_val_nll(model, kw):
    return mean_over(model, kw["val_loader"], lambda m, b: (flow_nll(m, b[0]).sum().item(), b[0].shape[0]))


@torch.no_grad()
def gan_w1(model, kw):
    """1-d Wasserstein distance between 4000 generated samples (times model.out_scale) and the validation data."""
    was = model.training
    model.eval()
    real = torch.cat([b[0].reshape(-1) for b in kw["val_loader"]]).float() * model.out_scale
    z = torch.randn(len(real), model.z_dim, generator=gen(7))
    fake = model.G(z).reshape(-1).float() * model.out_scale
    model.train(was)
    return float((torch.sort(fake).values - torch.sort(real).values).abs().mean())


def hazard_val_bce(model, kw):
    def fn(m, b):
        x, y = b[0], b[1]
        return F.binary_cross_entropy_with_logits(m(x).reshape(-1).float(), y.float(), reduction="sum").item(), len(y)
    return mean_over(model, kw["val_loader"], fn)


def dsm_val_loss(sigmas):
    def metric(model, kw):
        g = gen(99)

        def fn(m, b):
            x = b[0]
            i = torch.randint(0, len(sigmas), (x.shape[0],), generator=g)
            sigma = sigmas[i][:, None]
            noise = torch.randn(x.shape, generator=g)
            score = m(x + sigma * noise, i)
            return ((sigma * score + noise) ** 2).sum().item(), x.numel()
        return mean_over(model, kw["val_loader"], fn)
    return metric


def split_ds(*tensors, n_train):
    return TensorDataset(*(t[:n_train] for t in tensors)), TensorDataset(*(t[n_train:] for t in tensors))
