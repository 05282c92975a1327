"""Set av, healthy: five corrected twins of broken cases and five unusual but correct setups."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_av.cases_data import cox_durations_sorted_apart_from_features
from benchmarks.blind_preflight_av.cases_mechanics import vae_mean_recon_next_to_summed_kl
from benchmarks.blind_preflight_av.cases_shapes import diffusion_eps_column_vs_flat_noise
from benchmarks.blind_preflight_av.cases_targets import cox_censoring_flag_used_as_event
from benchmarks.blind_preflight_av.cases_trained import vae_sample_with_torch_normal
from benchmarks.blind_preflight_av.registry import (
    Denoiser,
    RealNVP,
    correlated_8d,
    cox_loss,
    healthy,
    loader,
    mixture_2d,
    mlp,
    person_period,
    seed,
    split_ds,
    survival_data,
    twin,
)

for _builder, _what in (
        (diffusion_eps_column_vs_flat_noise, "1-d DDPM with the (N, 1) prediction squeezed to the (N,) noise"),
        (cox_censoring_flag_used_as_event, "Cox partial likelihood with event = 1 - censored"),
        (vae_mean_recon_next_to_summed_kl, "VAE with reconstruction and KL both summed per sample, batch-averaged"),
        (cox_durations_sorted_apart_from_features, "Cox data sorted by time with one permutation for all columns"),
        (vae_sample_with_torch_normal, "VAE sampling z = mu + std * randn_like(std)")):
    healthy(_builder.__name__ + "_fixed", "corrected twin: " + _what)(twin(_builder))


@healthy("flow_clipped_cosine", "RealNVP on 8-d data: exact NLL with log|det|, grad clipping at 1.0 and a cosine "
         "schedule sized for max_steps=200")
def flow_clipped_cosine():
    seed(0)
    x = correlated_8d(3000, s=11)
    train, val = split_ds(x, n_train=2500)
    model = RealNVP(8)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200, eta_min=1e-4)

    def nll(model, batch):
        z, logdet = model(batch[0])
        log_pz = -0.5 * (z ** 2).sum(-1) - 0.5 * z.shape[-1] * math.log(2 * math.pi)
        return -(log_pz + logdet).mean()

    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(train, 128),
                val_loader=loader(val, 500, shuffle=False), loss_fn=nll, clip_grad_norm=1.0, max_steps=200)


@healthy("hazard_bf16_accumulation", "discrete-time hazard on person-period rows under bf16 with 2-step gradient "
         "accumulation and a pos_weight for the rare event rows")
def hazard_bf16_accumulation():
    seed(0)
    x, y = person_period(1500, s=12)
    n = int(len(y) * 0.8)
    train, val = split_ds(x, y, n_train=n)
    model = mlp(x.shape[1], 1, 32)
    pos_weight = ((1 - y).sum() / y.sum()).sqrt()

    def loss(model, batch):
        x, y = batch
        logit = model(x).squeeze(-1).float()
        return F.binary_cross_entropy_with_logits(logit, y, pos_weight=pos_weight.to(logit.device))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 1000, shuffle=False), loss_fn=loss,
                precision="bf16", accumulation_steps=2, max_steps=200)


def cosine_alpha_bar(steps, device, s=0.008):
    t = torch.arange(steps + 1, device=device, dtype=torch.float32) / steps
    f = torch.cos((t + s) / (1 + s) * math.pi / 2) ** 2
    return (f[1:] / f[0]).clamp(min=1e-4)


@healthy("diffusion_cosine_schedule_onecycle", "DDPM on a 2-d mixture with the cosine alpha_bar schedule, "
         "OneCycleLR over max_steps=200 and grad clipping")
def diffusion_cosine_schedule_onecycle():
    seed(0)
    x = mixture_2d(3000, s=13)
    train, val = split_ds(x, n_train=2500)
    model = Denoiser(dim=2, steps=200)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=200, pct_start=0.2)

    def ddpm_loss(model, batch):
        x0 = batch[0]
        t = torch.randint(0, 200, (x0.shape[0],), device=x0.device)
        ab = cosine_alpha_bar(200, x0.device)[t][:, None]
        noise = torch.randn_like(x0)
        return F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)

    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(train, 128),
                val_loader=loader(val, 500, shuffle=False), loss_fn=ddpm_loss, clip_grad_norm=1.0, max_steps=200)


class SiteCox(nn.Module):
    """Cox risk network with a pretrained, deliberately frozen embedding of the recruiting site."""

    def __init__(self, d=8, sites=12, emb=4):
        super().__init__()
        self.site = nn.Embedding(sites, emb)
        self.site.weight.requires_grad_(False)
        self.net = mlp(d + emb, 1, 32)

    def forward(self, x, site):
        return self.net(torch.cat([x, self.site(site)], dim=-1)).squeeze(-1)


@healthy("cox_frozen_site_embedding", "Cox model with a frozen pretrained site embedding (left out of the optimizer "
         "on purpose) and AdamW with a no-decay group for biases")
def cox_frozen_site_embedding():
    seed(0)
    x, time, event = survival_data(2000, s=14, censor_rate=0.8)
    site = torch.randint(0, 12, (2000,), generator=torch.Generator().manual_seed(14))
    train, val = split_ds(x, site, time, event, n_train=1500)
    model = SiteCox()
    decay = [p for n, p in model.net.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.net.named_parameters() if n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 1e-2}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3)

    def loss(model, batch):
        x, site, time, event = batch
        return cox_loss(model(x, site), time, event)

    return dict(model=model, optimizer=opt, train_loader=loader(train, 256),
                val_loader=loader(val, 500, shuffle=False), loss_fn=loss, max_steps=200)


@healthy("dsm_score_two_lr_groups", "denoising score matching over 10 noise levels with the sigma^2-weighted "
         "loss, a slower LR group for the input layer and a linear warm-up sized for max_steps=200")
def dsm_score_two_lr_groups():
    from benchmarks.blind_preflight_av.cases_targets import SIGMAS, ScoreNet
    seed(0)
    x = mixture_2d(3000, s=15)
    train, val = split_ds(x, n_train=2500)
    model = ScoreNet(SIGMAS)
    first = list(model.net[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    opt = torch.optim.Adam([{"params": first, "lr": 5e-4}, {"params": rest, "lr": 2e-3}])
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=20)

    def dsm(model, batch):
        x = batch[0]
        i = torch.randint(0, len(model.sigmas), (x.shape[0],), device=x.device)
        sigma = model.sigmas[i][:, None]
        noise = torch.randn_like(x)
        score = model(x + sigma * noise, i)
        return ((sigma * score + noise) ** 2).sum(-1).mean()

    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(train, 128),
                val_loader=loader(val, 500, shuffle=False), loss_fn=dsm, max_steps=200)
