"""Set av, what_is_trained: parts of a generative model that never get a gradient or are never stepped."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_av.cases_targets import gan_data, gan_loss
from benchmarks.blind_preflight_av.registry import (
    GAN,
    VAE,
    Coupling,
    Denoiser,
    case,
    correlated_8d,
    linear_alpha_bar,
    loader,
    mixture_2d,
    seed,
    split_ds,
    vae_data,
)


@case("gan_optimizer_has_only_discriminator", "what_is_trained",
      "The single optimizer is built from model.D.parameters() only, so the generator's parameters get gradients "
      "but are never stepped and G stays at its random init; give the optimizer the generator's parameters too "
      "(model.parameters() or a G param group).",
      r"(generator|\bG\b|model\.G).{0,80}(not|never|missing).{0,40}(optimi[sz]er|stepped|updated|trained)|"
      r"optimi[sz]er.{0,80}(only|missing|lacks|does not (contain|include|hold)).{0,60}(discriminator|generator|"
      r"model\.D|\bD\b)|(parameters?|params).{0,60}not in (the|any) optimi[sz]er|never (stepped|updated)")
def gan_optimizer_has_only_discriminator(fixed: bool = False):
    seed(0)
    x = gan_data()
    train, val = split_ds(x, n_train=2000)
    model = GAN()
    params = model.parameters() if fixed else model.D.parameters()
    opt = torch.optim.Adam(params, lr=2e-3, betas=(0.5, 0.999))
    return dict(model=model, optimizer=opt, train_loader=loader(train, 128),
                val_loader=loader(val, 1000, shuffle=False), loss_fn=gan_loss(), max_steps=300)


class SampledVAE(VAE):
    def forward(self, x):
        mu, logvar = self.encode(x)
        z = torch.normal(mu, (0.5 * logvar).exp())     # "sample from q(z|x)"
        return self.dec(z), mu, logvar


@case("vae_sample_with_torch_normal", "what_is_trained",
      "The VAE samples z with torch.normal(mu, std), which is not reparameterised: no gradient flows from the "
      "reconstruction back to mu, logvar and the encoder, which is trained only by the KL term and collapses to the "
      "prior; use z = mu + std * torch.randn_like(std) (or Normal(mu, std).rsample()).",
      r"torch\.normal|reparameteri[sz]|rsample|randn_like|no grad\w* .{0,40}(encoder|mu|mean)|"
      r"(encoder|mu).{0,60}(no|never|zero|without) .{0,20}grad\w*|not differentiable|non-?differentiable|"
      r"posterior collapse|collapses? to the prior")
def vae_sample_with_torch_normal(fixed: bool = False):
    seed(0)
    x = vae_data(2400)
    train, val = split_ds(x, n_train=2000)
    model = VAE(16, 3) if fixed else SampledVAE(16, 3)

    def elbo(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        rec = ((recon - x) ** 2).sum(-1).mean() / 0.05
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(-1).mean()
        return rec + kl

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 400, shuffle=False),
                loss_fn=elbo, max_steps=300)


@case("gan_generator_loss_on_detached_fake", "what_is_trained",
      "The generator's loss is computed on fake.detach() (the tensor reused from the discriminator step), so no "
      "gradient reaches the generator and G never learns; compute the generator loss on the non-detached G(z).",
      r"detach\w*|no grad\w* .{0,40}generator|generator.{0,60}(no|never|zero|without) .{0,20}grad\w*|"
      r"(cut|cuts|break\w*) .{0,30}graph")
def gan_generator_loss_on_detached_fake(fixed: bool = False):
    seed(0)
    x = gan_data()
    train, val = split_ds(x, n_train=2000)
    model = GAN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.5, 0.999))
    return dict(model=model, optimizer=opt, train_loader=loader(train, 128),
                val_loader=loader(val, 1000, shuffle=False),
                loss_fn=gan_loss(detach_in_g=not fixed), max_steps=300)


class ListFlow(nn.Module):
    """RealNVP whose couplings sit in a plain Python list."""

    def __init__(self, d=8, layers=4, as_module_list=False):
        super().__init__()
        masks = [(torch.arange(d) % 2 == i % 2).float() for i in range(layers)]
        couplings = [Coupling(d, m) for m in masks]
        self.layers = nn.ModuleList(couplings) if as_module_list else couplings
        self.loc = nn.Parameter(torch.zeros(d))
        self.log_scale = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        logdet = torch.zeros(x.shape[0], device=x.device)
        for layer in self.layers:
            x, ld = layer(x)
            logdet = logdet + ld
        z = (x - self.loc) * self.log_scale.exp()
        return z, logdet + self.log_scale.sum()


@case("flow_couplings_in_python_list", "what_is_trained",
      "The flow keeps its coupling layers in a plain Python list, so they are not registered submodules: "
      "model.parameters() and the optimizer see only the final elementwise loc/log_scale, and the couplings stay at "
      "their random init; hold them in an nn.ModuleList.",
      r"ModuleList|python list|plain list|not registered|unregistered|register\w* .{0,30}submodule|"
      r"(not|never) (in|part of) .{0,30}(parameters|optimi[sz]er)|missing from .{0,30}parameters")
def flow_couplings_in_python_list(fixed: bool = False):
    seed(0)
    x = correlated_8d(3000)
    train, val = split_ds(x, n_train=2500)
    model = ListFlow(8, as_module_list=fixed)

    def nll(model, batch):
        z, logdet = model(batch[0])
        return -(torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1) + logdet).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=nll, max_steps=300)


@case("diffusion_optimizer_on_ema_copy", "what_is_trained",
      "The optimizer is built over the EMA copy's parameters (ema_model.parameters()) while the loss runs the "
      "training denoiser, so the denoiser's gradients are never applied and the EMA weights get no gradient: nothing "
      "learns; build the optimizer on the trained model and update the EMA copy from it.",
      r"\bema\b|exponential moving average|(optimi[sz]er|parameters).{0,80}(copy|different model|other model|"
      r"not (the|in the) model)|(model'?s? )?parameters? .{0,40}not in .{0,20}optimi[sz]er|never (stepped|updated)|"
      r"optimi[sz]er .{0,40}(holds|has|over) .{0,40}(no|none of the) .{0,30}(model|trained)")
def diffusion_optimizer_on_ema_copy(fixed: bool = False):
    seed(0)
    x = mixture_2d(3000)
    train, val = split_ds(x, n_train=2500)
    model = Denoiser(dim=2, steps=100)
    ema_model = copy.deepcopy(model).requires_grad_(False)
    trained = model if fixed else ema_model.requires_grad_(True)

    def ddpm_loss(model, batch):
        x0 = batch[0]
        t = torch.randint(0, 100, (x0.shape[0],), device=x0.device)
        ab = linear_alpha_bar(100, x0.device)[t][:, None]
        noise = torch.randn_like(x0)
        return F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)

    return dict(model=model, optimizer=torch.optim.Adam(trained.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)
