"""Set ap, family mechanics: the objective's or the update's arithmetic is wrong (sign, schedule, scale, EMA)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from .cases_targets import EpsNet
from .cases_trained import cls_acc, two_task_data
from .registry import (
    T_STEPS,
    Views,
    betas,
    case,
    eps_mse,
    fix,
    fixed_of,
    knn_of,
    loader,
    lowrank_images,
    manifold,
    rmse_of,
    seed,
)


# ---------------------------------------------------------------------------------------------------------
class UncertaintyWeighted(nn.Module):
    """Two-task model with Kendall-style learned task weights (log variances) living in the model."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.reg_head, self.cls_head = nn.Linear(32, 3), nn.Linear(32, 4)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        h = self.trunk(x)
        return self.reg_head(h), self.cls_head(h)


@case("m_uncertainty_weights_no_log_term", "mechanics",
      "The learned task weighting is loss_i * exp(-s_i) without the + s_i regulariser, so the gradient on each "
      "log-variance s_i is always negative, s_i grows every step and both task weights shrink towards 0: the "
      "effective learning rate decays and the tasks stop learning.",
      r"log-variance|log_vars|\+ ?s_?i|\+ ?s regulari[sz]|exp\(-s|uncertainty|task weights? .*(shrink|collapse|zero|0)|"
      r"(weights?|s_?i) .*(grow|diverge|unbounded)|kendall")
def m_uncertainty_weights_no_log_term(fixed: bool = False):
    seed(0)
    x, reg, cls = two_task_data(3072, 3)
    xv, regv, clsv = two_task_data(768, 4)
    model = UncertaintyWeighted()

    def weighted(model, batch):
        x, reg, cls = batch
        r, c = model(x)
        losses = torch.stack([F.mse_loss(r, reg), F.cross_entropy(c, cls)])
        total = (losses * torch.exp(-model.log_vars)).sum()
        return total + model.log_vars.sum() if fixed else total
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x, reg, cls), 64),
                val_loader=loader(TensorDataset(xv, regv, clsv), 256, shuffle=False), loss_fn=weighted, max_steps=300)


fix("m_uncertainty_weights_no_log_term", fixed_of(m_uncertainty_weights_no_log_term), cls_acc,
    "val accuracy of the classification task")


# ---------------------------------------------------------------------------------------------------------
class SmallVAE(nn.Module):
    def __init__(self, d=64, z=6):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 2 * z))
        self.dec = nn.Sequential(nn.Linear(z, 64), nn.ReLU(), nn.Linear(64, d), nn.Sigmoid())

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, -1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return self.dec(z), mu, logvar


@case("m_vae_kl_sign_flipped", "mechanics",
      "The KL term is written as kld = -0.5 * sum(1 + logvar - mu^2 - exp(logvar)) (already the positive KL) and "
      "then subtracted, loss = recon - kld: the optimiser maximises the KL, the posterior variances collapse and "
      "the latent codes are pushed far off the prior.",
      r"(kl|kld)\w* .*(sign|subtract|maximi[sz])|recon(struction)? ?- ?kld?|subtract\w* .*kl|maximi[sz]es? the kl|"
      r"wrong sign")
def m_vae_kl_sign_flipped(fixed: bool = False):
    seed(0)
    x, xv = lowrank_images(2048, 15), lowrank_images(512, 16)
    model = SmallVAE()

    def vae_loss(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        rec = F.binary_cross_entropy(recon, x, reduction="sum") / len(x)
        kld = -0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp()) / len(x)
        return rec + kld if fixed else rec - kld
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x), 128), val_loader=loader(TensorDataset(xv), 256, shuffle=False),
                loss_fn=vae_loss, max_steps=300)


fix("m_vae_kl_sign_flipped", fixed_of(m_vae_kl_sign_flipped), rmse_of(lambda m, b: (m(b[0])[0], b[0])),
    "val reconstruction RMSE (z = mu)", higher=False)


# ---------------------------------------------------------------------------------------------------------
@case("m_diffusion_alpha_bar_not_cumprod", "mechanics",
      "The forward process uses alpha_bar = 1 - betas (the per-step alphas) instead of torch.cumprod(1 - betas, 0), "
      "so training only ever sees x_t with a few percent of noise and the denoiser never learns the high-noise "
      "timesteps that sampling starts from.",
      r"cumprod|cumulative product|per-step alphas?|alpha_?bar ?= ?1 ?- ?betas|(high|large)[- ]noise (timesteps|levels)")
def m_diffusion_alpha_bar_not_cumprod(fixed: bool = False):
    seed(0)
    x0, xv = manifold(4096, 3), manifold(1024, 4)
    model = EpsNet()
    alphas = 1 - betas()
    alpha_bar = torch.cumprod(alphas, 0) if fixed else alphas

    def ddpm_loss(model, batch):
        x0 = batch[0]
        t = torch.randint(0, T_STEPS, (len(x0),), device=x0.device)
        noise = torch.randn_like(x0)
        a = alpha_bar.to(x0.device)[t].view(-1, 1)
        return F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x0), 128), val_loader=loader(TensorDataset(xv), 256, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)


fix("m_diffusion_alpha_bar_not_cumprod", fixed_of(m_diffusion_alpha_bar_not_cumprod), eps_mse,
    "val eps MSE (true schedule)", higher=False)


# ---------------------------------------------------------------------------------------------------------
class MoCoLite(nn.Module):
    """Query encoder trained by backprop, key encoder an EMA of it, updated in forward as MoCo does."""

    def __init__(self, fixed: bool, m: float = 0.99):
        super().__init__()
        self.fixed, self.m = fixed, m
        self.encoder_q = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))
        self.encoder_k = copy.deepcopy(self.encoder_q)
        for p in self.encoder_k.parameters():
            p.requires_grad = False

    @torch.no_grad()
    def _momentum_update(self):
        for q, k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            if self.fixed:
                k.data = k.data * self.m + q.data * (1 - self.m)
            else:
                q.data = q.data * self.m + k.data * (1 - self.m)

    def forward(self, x1, x2=None):
        q = F.normalize(self.encoder_q(x1), dim=-1)
        if x2 is None:
            return q
        if self.training:
            self._momentum_update()
        with torch.no_grad():
            k = F.normalize(self.encoder_k(x2), dim=-1)
        return q, k


@case("m_momentum_update_reversed", "mechanics",
      "The momentum update is written backwards, param_q = m * param_q + (1 - m) * param_k: instead of the key "
      "encoder slowly following the query encoder, the trained query encoder is dragged back towards the frozen "
      "initial key encoder at every step.",
      r"momentum update|\bema\b|backwards|revers|param_?q ?= ?m|key encoder|encoder_k|(dragged|pulled) back|"
      r"moving average .*(wrong|swap)")
def m_momentum_update_reversed(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 17), Views(512, 18)
    model = MoCoLite(fixed)

    def moco_loss(model, batch, tau=0.2):
        v1, v2, _ = batch
        q, k = model(v1, v2)
        return F.cross_entropy(q @ k.T / tau, torch.arange(len(v1), device=v1.device))
    return dict(model=model, optimizer=torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3),
                train_loader=loader(train, 128, drop_last=True), val_loader=loader(val, 256, shuffle=False),
                loss_fn=moco_loss, max_steps=300)


fix("m_momentum_update_reversed", fixed_of(m_momentum_update_reversed), knn_of(), "val 1-NN accuracy (query encoder)")


# ---------------------------------------------------------------------------------------------------------
@case("m_temperature_multiplied", "mechanics",
      "The NT-Xent logits are sim * temperature with temperature = 0.07 instead of sim / temperature: cosine "
      "similarities in [-1, 1] become logits in [-0.07, 0.07], the softmax is nearly uniform and the contrastive "
      "gradient is tiny.",
      r"temperature|sim ?\* ?0?\.07|logit scale|nearly uniform|logits .*(tiny|small|flat)|\* ?tau")
def m_temperature_multiplied(fixed: bool = False):
    seed(0)
    train, val = Views(2048, 19), Views(512, 20)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16))
    temperature = 0.07

    def nt_xent(model, batch):
        v1, v2, _ = batch
        z = F.normalize(model(torch.cat([v1, v2])), dim=-1)
        sim = z @ z.T
        logits = sim / temperature if fixed else sim * temperature
        n = len(v1)
        logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
        target = (torch.arange(2 * n, device=z.device) + n) % (2 * n)
        return F.cross_entropy(logits, target)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                train_loader=loader(train, 128, drop_last=True), val_loader=loader(val, 256, shuffle=False),
                loss_fn=nt_xent, max_steps=300)


fix("m_temperature_multiplied", fixed_of(m_temperature_multiplied), knn_of(), "val 1-NN accuracy")
