"""Set av, shapes: broadcasting and reduction-axis slips in survival and generative losses."""

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
    linear_alpha_bar,
    loader,
    mixture_1d,
    person_period,
    seed,
    split_ds,
    survival_data,
    vae_data,
)


@case("cox_log_hazard_column_times_events", "shapes",
      "The Cox model's log-hazard is (N, 1) while the event indicator is (N,): (log_h - log_den) * event broadcasts "
      "to an (N, N) matrix, so every subject's term is multiplied by every event flag and censored subjects count "
      "as events; squeeze the model output to (N,) (log_h.squeeze(-1)) before the partial likelihood.",
      r"\(N, ?1\).{0,80}\(N,\)|\(N,\).{0,80}\(N, ?1\)|\(N, ?N\)|broadcast|\bsqueeze|"
      r"censor\w* (subjects? )?(are |were )?(counted|treated) as events|event (indicator|flag)s? (is |are )?ignored")
def cox_log_hazard_column_times_events(fixed: bool = False):
    seed(0)
    x, time, event = survival_data(2000, censor_rate=1.0, s=1, informative=True)
    train, val = split_ds(x, time, event, n_train=1500)
    model = Hazard(8)

    def partial_likelihood(model, batch):
        x, time, event = batch
        log_h = model(x)
        if fixed:
            log_h = log_h.squeeze(-1)
        order = torch.argsort(time, descending=True)
        log_h, event = log_h[order], event[order]
        log_den = torch.logcumsumexp(log_h, dim=0)
        return -((log_h - log_den) * event).sum() / event.sum().clamp(min=1.0)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 256), val_loader=loader(val, 500, shuffle=False),
                loss_fn=partial_likelihood, max_steps=300)


@case("diffusion_eps_column_vs_flat_noise", "shapes",
      "1-d diffusion: the denoiser predicts eps of shape (N, 1) while the sampled noise is (N,), so F.mse_loss "
      "broadcasts them to (N, N) and the model learns the batch-mean noise (about zero) for every point; compare "
      "pred.squeeze(-1) with the noise, or keep the noise (N, 1).",
      r"\(N, ?1\).{0,80}\(N,\)|\(N,\).{0,80}\(N, ?1\)|\(N, ?N\)|broadcast|\bsqueeze|"
      r"target size .{0,40}different")
def diffusion_eps_column_vs_flat_noise(fixed: bool = False):
    seed(0)
    x = mixture_1d(3000)
    train, val = split_ds(x, n_train=2500)
    model = Denoiser(dim=1, steps=100)

    def ddpm_loss(model, batch):
        x0 = batch[0]                                   # (N,)
        t = torch.randint(0, 100, (x0.shape[0],), device=x0.device)
        noise = torch.randn_like(x0)
        ab = linear_alpha_bar(100, x0.device)[t]
        x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        pred = model(x_t.unsqueeze(-1), t)              # (N, 1)
        if fixed:
            pred = pred.squeeze(-1)
        return F.mse_loss(pred, noise)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)


@case("flow_base_log_prob_not_summed", "shapes",
      "The flow's base log-density Normal(0, 1).log_prob(z) is (N, D) and is never summed over the feature dimension "
      "(.sum(-1)) before the (N,) log-determinant is added, so the mean over (N, D) divides the base term by D: "
      "the log|det| term is weighted D times too much and the flow over-expands, a bad likelihood.",
      r"sum\(-1\)|sum\(dim=-?1\)|sum over (the )?(feature|event|last|latent)|not summed|\(N, ?D\)|\(N, ?8\)|"
      r"per[- ]dimension|log.?det\w*.{0,60}(weigh|scale|times|over)|divid\w* .{0,30}by (D|the dimension)|"
      r"broadcast\w* .{0,40}\(N, ?(D|8)\)")
def flow_base_log_prob_not_summed(fixed: bool = False):
    seed(0)
    x = correlated_8d(3000)
    train, val = split_ds(x, n_train=2500)
    model = RealNVP(8)
    base = torch.distributions.Normal(0.0, 1.0)

    def nll(model, batch):
        z, logdet = model(batch[0])
        log_pz = base.log_prob(z)                       # (N, 8)
        if fixed:
            log_pz = log_pz.sum(-1)
        else:
            logdet = logdet.unsqueeze(-1)               # "make the shapes line up"
        return -(log_pz + logdet).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=nll, max_steps=300)


@case("vae_target_keeps_channel_dim", "shapes",
      "The VAE flattens its input with x.view(N, -1) but the reconstruction target keeps the loader's (N, 1, D) "
      "shape, so F.mse_loss(recon (N, D), x (N, 1, D)) broadcasts to (N, N, D) and every sample is reconstructed as "
      "the batch mean; flatten the target too (x.view(N, -1)).",
      r"\(N, ?1, ?D\)|\(N, ?N, ?D\)|\(N, ?D\).{0,80}\(N, ?1|\(\d+, ?1, ?\d+\)|\(\d+, ?\d+, ?\d+\)|"
      r"flatten\w* .{0,20}(the )?target|target size .{0,40}different")
def vae_target_keeps_channel_dim(fixed: bool = False):
    seed(0)
    x = vae_data(2400).unsqueeze(1)                     # stored as (N, 1, 16) "signals"
    train, val = split_ds(x, n_train=2000)
    model = VAE(16, 3)

    def elbo(model, batch):
        x = batch[0]
        flat = x.view(x.shape[0], -1)
        recon, mu, logvar = model(flat)
        target = flat if fixed else x
        rec = F.mse_loss(recon, target) * flat.shape[1]
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(-1).mean()
        return rec / 0.05 + kl

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 400, shuffle=False),
                loss_fn=elbo, max_steps=300)


@case("hazard_logit_column_vs_labels", "shapes",
      "The discrete-time hazard model's logits are (N, 1) and the person-period labels (N,); the hand-written "
      "Bernoulli log-likelihood y * logsigmoid(l) + (1 - y) * logsigmoid(-l) broadcasts to (N, N), pairing every "
      "logit with every label, so the model learns only the base hazard rate; squeeze the logits to (N,).",
      r"\(N, ?1\).{0,80}\(N,\)|\(N,\).{0,80}\(N, ?1\)|\(N, ?N\)|broadcast|\bsqueeze")
def hazard_logit_column_vs_labels(fixed: bool = False):
    seed(0)
    x, y = person_period(1500, s=2)
    n = int(len(y) * 0.8)
    train, val = split_ds(x, y, n_train=n)
    model = Hazard(x.shape[1])

    def nll(model, batch):
        x, y = batch
        logit = model(x)
        if fixed:
            logit = logit.squeeze(-1)
        return -(y * F.logsigmoid(logit) + (1 - y) * F.logsigmoid(-logit)).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 256), val_loader=loader(val, 1000, shuffle=False),
                loss_fn=nll, max_steps=300)

