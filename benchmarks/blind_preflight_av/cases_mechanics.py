"""Set av, mechanics: how the loss terms are weighted and combined, the change of variables, the noise schedule, the LR schedule and the order
of the risk sets."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_av.registry import (
    VAE,
    Denoiser,
    Hazard,
    RealNVP,
    case,
    correlated_8d,
    loader,
    mixture_2d,
    seed,
    split_ds,
    survival_data,
    vae_data,
)


def vae_elbo(kl_over_batch: bool):
    def loss(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        if kl_over_batch:   # the classic mix: mean-reduced MSE next to a KL summed over batch and latent
            return F.mse_loss(recon, x) + (-0.5 * torch.sum(1 + logvar - mu ** 2 - logvar.exp()))
        rec = ((recon - x) ** 2).sum(-1).mean() / 0.05
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(-1).mean()
        return rec + kl
    return loss


@case("vae_mean_recon_next_to_summed_kl", "mechanics",
      "The VAE loss adds F.mse_loss (mean over batch and features) to a KL term torch.sum-med over batch and latent "
      "dimensions, so the KL is weighted batch_size * D times too heavily against the reconstruction: the posterior "
      "collapses to the prior and reconstructions are the data mean; reduce both the same way (sum over features, "
      "mean over the batch).",
      r"(kl|kld).{0,80}(sum|summed|weigh|dominat|scale|too (large|heavy|strong))|"
      r"(mean|averag)\w*.{0,60}(sum|summed)|(sum|summed).{0,60}(mean|averag)|reduction|posterior collapse|"
      r"collaps\w* to the prior|beta")
def vae_mean_recon_next_to_summed_kl(fixed: bool = False):
    seed(0)
    x = vae_data(2400)
    train, val = split_ds(x, n_train=2000)
    model = VAE(16, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 400, shuffle=False),
                loss_fn=vae_elbo(kl_over_batch=not fixed), max_steps=300)


@case("flow_log_det_subtracted", "mechanics",
      "The flow's negative log-likelihood subtracts the log-determinant, -(log p(z) - log|det dz/dx|), instead of "
      "adding it (change of variables: log p(x) = log p(z) + log|det J|), so the flow is rewarded for contracting "
      "everything onto z = 0: the loss falls without bound while the true likelihood gets worse.",
      r"log.?det\w*.{0,80}(sign|subtract|minus|add|plus|\+)|(sign|subtract|minus).{0,60}log.?det|"
      r"change of variables|jacobian.{0,60}(sign|subtract|add)|contract\w*|unbounded|without bound|-inf")
def flow_log_det_subtracted(fixed: bool = False):
    seed(0)
    x = correlated_8d(3000, s=3)
    train, val = split_ds(x, n_train=2500)
    model = RealNVP(8)

    def nll(model, batch):
        z, logdet = model(batch[0])
        log_pz = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1)
        return -(log_pz + logdet).mean() if fixed else -(log_pz - logdet).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=nll, max_steps=300)


@case("diffusion_alpha_bar_from_betas", "mechanics",
      "The noise schedule takes alphas_cumprod = torch.cumprod(betas) instead of torch.cumprod(1 - betas): "
      "alpha_bar is about 1e-4 at t = 0 and underflows to 0 after, so every x_t is pure noise and the denoiser only "
      "learns to copy its input; use alphas = 1 - betas, alphas_cumprod = cumprod(alphas).",
      r"cumprod|1 ?- ?betas?|alphas? ?= ?1 ?- ?beta|alpha_?bar|alphas_cumprod|noise schedule|pure noise|"
      r"signal.{0,20}(zero|vanish)|snr")
def diffusion_alpha_bar_from_betas(fixed: bool = False):
    seed(0)
    x = mixture_2d(3000)
    train, val = split_ds(x, n_train=2500)
    model = Denoiser(dim=2, steps=100)

    def ddpm_loss(model, batch):
        x0 = batch[0]
        betas = torch.linspace(1e-4, 0.05, 100, device=x0.device)
        alphas_cumprod = torch.cumprod(1 - betas, 0) if fixed else torch.cumprod(betas, 0)
        t = torch.randint(0, 100, (x0.shape[0],), device=x0.device)
        ab = alphas_cumprod[t][:, None]
        noise = torch.randn_like(x0)
        return F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)


@case("vae_steplr_per_epoch_stepped_per_batch", "mechanics",
      "StepLR(step_size=1, gamma=0.8) was written for a per-epoch schedule but is stepped after every optimizer "
      "step, so the learning rate decays by 0.8 per batch and is ~1e-6 of its start after 60 steps: training stops "
      "early; step it once per epoch or size step_size in steps.",
      r"StepLR|step_size|gamma|per[- ](epoch|batch|step|iteration)|every (batch|step|iteration)|"
      r"(lr|learning rate).{0,60}(decays?\b|decayed|collaps|shrink|vanish|near zero|to zero)")
def vae_steplr_per_epoch_stepped_per_batch(fixed: bool = False):
    seed(0)
    x = vae_data(2400)
    train, val = split_ds(x, n_train=2000)
    model = VAE(16, 3)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=16 * 100 if fixed else 1, gamma=0.8)
    return dict(model=model, optimizer=opt, scheduler=sched, train_loader=loader(train, 128),
                val_loader=loader(val, 400, shuffle=False), loss_fn=vae_elbo(False), max_steps=300)


@case("cox_risk_set_sorted_ascending", "mechanics",
      "The Cox partial likelihood sorts by time ascending (torch.argsort(time)) before logcumsumexp, so each "
      "subject's 'risk set' is the subjects who failed before it rather than those still at risk (time >= t_i): "
      "the model learns the hazard ordering reversed; sort descending (argsort(time, descending=True)).",
      r"descending|ascending|argsort|sort\w* .{0,40}(order|time|wrong|revers)|revers\w*|risk set|"
      r"(still )?at risk|time ?>= ?t|inverted")
def cox_risk_set_sorted_ascending(fixed: bool = False):
    seed(0)
    x, time, event = survival_data(2000, s=5, censor_rate=0.8)
    train, val = split_ds(x, time, event, n_train=1500)
    model = Hazard(8)

    def loss(model, batch):
        x, time, event = batch
        log_h = model(x).squeeze(-1)
        order = torch.argsort(time, descending=fixed)
        log_h, event = log_h[order], event[order]
        return -((log_h - torch.logcumsumexp(log_h, 0)) * event).sum() / event.sum().clamp(min=1.0)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 256), val_loader=loader(val, 500, shuffle=False),
                loss_fn=loss, max_steps=300)
