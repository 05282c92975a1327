"""Set av, data: what the loaders feed the generative and survival models."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_av.cases_targets import gan_data, gan_loss
from benchmarks.blind_preflight_av.registry import (
    GAN,
    VAE,
    Denoiser,
    Hazard,
    case,
    cox_loss,
    linear_alpha_bar,
    loader,
    mixture_2d,
    seed,
    split_ds,
    survival_data,
    vae_data,
)


@case("vae_raw_pixels_into_bce", "data",
      "The images reach the VAE as raw 0-255 intensities (no ToTensor / division by 255), but the decoder is a "
      "Bernoulli model trained with binary cross-entropy (BCEWithLogits), whose targets must lie in [0, 1]: the loss pushes "
      "every pixel to 1 and the encoder sees unscaled inputs; scale the data to [0, 1] (x / 255).",
      r"255|\[0, ?1\]|0\W+1 range|ToTensor|unscaled|raw (pixel|intensit)|"
      r"(bce|binary cross).{0,60}(target|label)s?.{0,40}(range|outside|above|greater|exceed)")
def vae_raw_pixels_into_bce(fixed: bool = False):
    seed(0)
    x = vae_data(2400)
    pixels = torch.round((torch.sigmoid(2 * x)) * 255)          # 8-bit "images"
    data = pixels / 255.0 if fixed else pixels
    train, val = split_ds(data, n_train=2000)
    model = VAE(16, 3)
    model.sigmoid_out = True

    def elbo(model, batch):
        x = batch[0]
        recon_logits, mu, logvar = model(x)
        rec = F.binary_cross_entropy_with_logits(recon_logits, x, reduction="sum") / x.shape[0]
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(-1).mean()
        return rec + kl

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 400, shuffle=False),
                loss_fn=elbo, max_steps=300)


@case("cox_durations_sorted_apart_from_features", "data",
      "To prepare for the Cox loss the durations and event flags were sorted by time (np.sort / sort_values on those "
      "columns only) while the feature matrix kept its original row order, so the times no longer belong to their "
      "subjects and the model fits noise; sort the whole table (features, times, events) with one permutation, or "
      "sort inside the loss.",
      r"(sort|order|permut)\w*.{0,80}(features?|x|rows?|covariates?).{0,40}(not|unsorted|original|apart|separately)|"
      r"(features?|rows?|covariates?).{0,60}(no longer|not) (aligned|match|belong)|misalign\w*|out of (sync|order)|"
      r"one permutation|same (permutation|order)|pairing|(shuffled|sorted) (apart|separately|independently)")
def cox_durations_sorted_apart_from_features(fixed: bool = False):
    seed(0)
    x, time, event = survival_data(2000, s=6, censor_rate=0.8)
    xt, tt, et = x[:1500], time[:1500], event[:1500]
    order = torch.argsort(tt, descending=True)
    if fixed:
        xt, tt, et = xt[order], tt[order], et[order]
    else:
        tt, et = tt[order], et[order]                             # durations sorted, features not
    train = torch.utils.data.TensorDataset(xt, tt, et)
    _, val = split_ds(x, time, event, n_train=1500)
    model = Hazard(8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 256), val_loader=loader(val, 500, shuffle=False),
                loss_fn=lambda m, b: cox_loss(m(b[0]), b[1], b[2]), max_steps=300)


@case("gan_real_data_outside_tanh_range", "data",
      "The generator ends in tanh (outputs in [-1, 1]) but the real samples are fed unscaled (around 3 +- 0.5), so "
      "the generator cannot reach the data and the discriminator separates them trivially; scale the real data "
      "into [-1, 1] (and unscale generated samples) or drop the tanh.",
      r"tanh|\[-1, ?1\]|scal\w* .{0,30}(real|data) .{0,30}(into|to) |unscaled real|cannot (reach|produce|match)|"
      r"outside (the )?(generator'?s? )?(output )?range")
def gan_real_data_outside_tanh_range(fixed: bool = False):
    seed(0)
    x = gan_data()
    scale = 5.0 if fixed else 1.0
    train, val = split_ds(x / scale, n_train=2000)
    model = GAN(tanh=True)
    model.out_scale = scale
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.5, 0.999))
    return dict(model=model, optimizer=opt, train_loader=loader(train, 128),
                val_loader=loader(val, 1000, shuffle=False), loss_fn=gan_loss(), max_steps=300)


@case("cox_batch_size_one", "data",
      "The Cox partial likelihood is computed per mini-batch, and the DataLoader has batch_size=1: each risk set "
      "holds only the subject itself, so log_h - logcumsumexp(log_h) is exactly 0, the loss is 0 and no gradient "
      "flows; use large batches (hundreds) or the full data set per step.",
      r"batch_size ?= ?1\b|batch size (of )?1\b|single (sample|subject)|risk set.{0,60}(only|itself|one)|"
      r"(loss|gradient)s? (is |are )?(always |exactly |identically )?(0|zero)|larger batch|full[- ]batch")
def cox_batch_size_one(fixed: bool = False):
    seed(0)
    x, time, event = survival_data(2000, s=7, censor_rate=0.8)
    train, val = split_ds(x, time, event, n_train=1500)
    model = Hazard(8)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 256 if fixed else 1), val_loader=loader(val, 500, shuffle=False),
                loss_fn=lambda m, b: cox_loss(m(b[0]), b[1], b[2]), max_steps=300)


@case("diffusion_data_not_standardised", "data",
      "The diffusion model is trained on raw data of scale ~50 while the forward process adds unit-variance noise "
      "(the DDPM schedule assumes data scaled to about [-1, 1] / unit variance): the noise is tiny next to the "
      "signal, x_T is far from N(0, I) and the noise is hard to recover; standardise the data first.",
      r"(standardi[sz]|normali[sz]|scal)\w* .{0,40}(data|x0|x_0|samples)|unit variance|\[-1, ?1\]|"
      r"noise .{0,40}(tiny|small|negligible)|x_T .{0,30}(not|far)|signal.to.noise")
def diffusion_data_not_standardised(fixed: bool = False):
    seed(0)
    x = mixture_2d(3000, scale=1.0 if fixed else 50.0)
    train, val = split_ds(x, n_train=2500)
    model = Denoiser(dim=2, steps=100)

    def ddpm_loss(model, batch):
        x0 = batch[0]
        t = torch.randint(0, 100, (x0.shape[0],), device=x0.device)
        ab = linear_alpha_bar(100, x0.device)[t][:, None]
        noise = torch.randn_like(x0)
        return F.mse_loss(model(ab.sqrt() * x0 + (1 - ab).sqrt() * noise, t), noise)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)
