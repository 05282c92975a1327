"""Set av: per broken case, the fact the bug rests on (printed by ``verify.py`` before the case is trained next to its
one-line fix) and the FixTable entry: the fixed builder and the case's own metric."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_av import cases_data as D
from benchmarks.blind_preflight_av import cases_mechanics as M
from benchmarks.blind_preflight_av import cases_shapes as S
from benchmarks.blind_preflight_av import cases_targets as T
from benchmarks.blind_preflight_av import cases_trained as W
from benchmarks.blind_preflight_av.registry import (
    c_index,
    dsm_val_loss,
    eps_mse_of,
    fix,
    fixed_of,
    flow_val_nll,
    gan_w1,
    hazard_val_bce,
    linear_alpha_bar,
    vae_recon_mse,
)


def f_cox_column():
    log_h, event = torch.zeros(4, 1), torch.tensor([1.0, 0.0, 0.0, 1.0])
    print("  (N,1) log-hazard times (N,) events ->", tuple((log_h * event).shape))


def f_eps_column():
    print("  (N,1) - (N,) ->", tuple((torch.zeros(8, 1) - torch.zeros(8)).shape))


def f_flow_sum():
    z = torch.zeros(5, 8)
    lp = torch.distributions.Normal(0.0, 1.0).log_prob(z)
    print("  log_prob(z) shape", tuple(lp.shape), "; (N,8)+(N,1) mean weights log|det| by 8 relative to sum(-1)")


def f_vae_target():
    print("  mse_loss((N,16),(N,1,16)) broadcast ->", tuple(torch.broadcast_shapes((32, 16), (32, 1, 16))))


def f_hazard_column():
    print("  (N,1) logits with (N,) labels ->", tuple((torch.zeros(6, 1) * torch.zeros(6)).shape))


def f_redrawn():
    a, b = torch.randn(10000), torch.randn(10000)
    print(f"  corr(noise used for x_t, redrawn target) = {torch.corrcoef(torch.stack([a, b]))[0, 1]:.3f}")


def f_gan_label():
    print("  generator target in the broken loss: zeros (the discriminator's 'fake' label)")


def f_censor_flag():
    _, _, event = T.survival_data(2000, s=3, censor_rate=0.8)
    print(f"  event rate {event.mean():.2f}; passed as event: 1 - event (rate {(1 - event).mean():.2f})")


def f_all_periods():
    _, y = T.person_period(1500, s=4)
    _, yb = T.person_period(1500, s=4, all_periods=True)
    print(f"  positive rows: correct {y.mean():.3f}, every-period labelling {yb.mean():.3f}")


def f_dsm_sign():
    x = torch.zeros(1000, 2)
    noise = torch.randn(1000, 2)
    print(f"  mean <noise/sigma, data - noisy> = {(noise * (x - (x + noise))).sum(-1).mean():.2f} (< 0: wrong sign)")


def f_only_d():
    m = W.GAN()
    n_d = sum(p.numel() for p in m.D.parameters())
    print(f"  optimizer holds {n_d} of {sum(p.numel() for p in m.parameters())} parameters (G missing)")


def f_torch_normal():
    mu = torch.zeros(3, requires_grad=True)
    z = torch.normal(mu, torch.ones(3))
    print("  torch.normal(mu, std).requires_grad =", z.requires_grad)


def f_detached_fake():
    m = W.GAN()
    fake = m.G(torch.randn(4, m.z_dim)).detach()
    print("  G(z).detach().requires_grad =", fake.requires_grad)


def f_list_flow():
    m = W.ListFlow(8)
    print("  parameters registered:", sum(p.numel() for p in m.parameters()),
          "of", sum(p.numel() for p in W.ListFlow(8, as_module_list=True).parameters()))


def f_ema():
    print("  optimizer params are ema_model's; the loss differentiates model's: disjoint tensors")


def f_kl_sum():
    print("  F.mse_loss divides by 128*16 = 2048; torch.sum KL over batch 128 x latent 3 is not divided")


def f_logdet_sign():
    print("  change of variables: log p(x) = log p(z) + log|det dz/dx|; subtracting it rewards contracting to z=0")


def f_cumprod_betas():
    betas = torch.linspace(1e-4, 0.05, 100)
    print(f"  cumprod(betas)[0]={torch.cumprod(betas, 0)[0]:.1e} [10]={torch.cumprod(betas, 0)[10]:.1e}; "
          f"cumprod(1-betas)[99]={linear_alpha_bar(100)[99]:.3f}")


def f_steplr():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2e-3)
    s = torch.optim.lr_scheduler.StepLR(opt, 1, 0.8)
    for _ in range(60):
        opt.step()
        s.step()
    print(f"  lr after 60 steps: {opt.param_groups[0]['lr']:.2e}")


def f_ascending():
    t = torch.tensor([3.0, 1.0, 2.0])
    print("  argsort ascending", torch.argsort(t).tolist(), "-> risk set of the earliest time is itself only")


def f_raw_pixels():
    logit = torch.zeros(1, requires_grad=True)
    F.binary_cross_entropy_with_logits(logit, torch.tensor([200.0])).backward()
    print("  d BCEWithLogits(logit=0, target=200) / d logit =", logit.grad.item(), "(keeps pushing to +inf)")


def f_sorted_apart():
    print("  durations sorted by descending time, feature rows left in original order")


def f_tanh():
    print("  tanh range [-1, 1]; real data mean", float(T.gan_data().mean()))


def f_bs1():
    log_h = torch.randn(1, requires_grad=True)
    print("  batch of one: log_h - logcumsumexp(log_h) =", (log_h - torch.logcumsumexp(log_h, 0)).item())


def f_unscaled():
    x = D.mixture_2d(3000, scale=50.0)
    print(f"  data std {x.std():.1f} vs unit noise; x_T = sqrt(ab_T) x0 + ... has std "
          f"{(linear_alpha_bar(100)[-1].sqrt() * x.std()):.1f}")


eps = eps_mse_of()
eps1 = eps_mse_of(dim=1)
for name, builder, metric, label, fact, higher in (
        ("cox_log_hazard_column_times_events", S.cox_log_hazard_column_times_events, c_index, "val C-index",
         f_cox_column, True),
        ("diffusion_eps_column_vs_flat_noise", S.diffusion_eps_column_vs_flat_noise, eps1, "val eps-MSE",
         f_eps_column, False),
        ("flow_base_log_prob_not_summed", S.flow_base_log_prob_not_summed, flow_val_nll, "val NLL", f_flow_sum, False),
        ("vae_target_keeps_channel_dim", S.vae_target_keeps_channel_dim, vae_recon_mse, "val recon MSE",
         f_vae_target, False),
        ("hazard_logit_column_vs_labels", S.hazard_logit_column_vs_labels, hazard_val_bce, "val BCE",
         f_hazard_column, False),
        ("diffusion_noise_target_redrawn", T.diffusion_noise_target_redrawn, eps, "val eps-MSE", f_redrawn, False),
        ("gan_generator_trained_toward_fake_label", T.gan_generator_trained_toward_fake_label, gan_w1, "W1",
         f_gan_label, False),
        ("cox_censoring_flag_used_as_event", T.cox_censoring_flag_used_as_event, c_index, "val C-index",
         f_censor_flag, True),
        ("hazard_labels_on_every_period", T.hazard_labels_on_every_period, hazard_val_bce, "val BCE",
         f_all_periods, False),
        ("dsm_score_target_sign", T.dsm_score_target_sign, dsm_val_loss(T.SIGMAS), "val DSM loss", f_dsm_sign, False),
        ("gan_optimizer_has_only_discriminator", W.gan_optimizer_has_only_discriminator, gan_w1, "W1", f_only_d,
         False),
        ("vae_sample_with_torch_normal", W.vae_sample_with_torch_normal, vae_recon_mse, "val recon MSE",
         f_torch_normal, False),
        ("gan_generator_loss_on_detached_fake", W.gan_generator_loss_on_detached_fake, gan_w1, "W1",
         f_detached_fake, False),
        ("flow_couplings_in_python_list", W.flow_couplings_in_python_list, flow_val_nll, "val NLL", f_list_flow,
         False),
        ("diffusion_optimizer_on_ema_copy", W.diffusion_optimizer_on_ema_copy, eps, "val eps-MSE", f_ema, False),
        ("vae_mean_recon_next_to_summed_kl", M.vae_mean_recon_next_to_summed_kl, vae_recon_mse, "val recon MSE",
         f_kl_sum, False),
        ("flow_log_det_subtracted", M.flow_log_det_subtracted, flow_val_nll, "val NLL", f_logdet_sign, False),
        ("diffusion_alpha_bar_from_betas", M.diffusion_alpha_bar_from_betas, eps, "val eps-MSE", f_cumprod_betas,
         False),
        ("vae_steplr_per_epoch_stepped_per_batch", M.vae_steplr_per_epoch_stepped_per_batch, vae_recon_mse,
         "val recon MSE", f_steplr, False),
        ("cox_risk_set_sorted_ascending", M.cox_risk_set_sorted_ascending, c_index, "val C-index", f_ascending, True),
        ("vae_raw_pixels_into_bce", D.vae_raw_pixels_into_bce, vae_recon_mse, "val recon MSE ([0,1] scale)",
         f_raw_pixels, False),
        ("cox_durations_sorted_apart_from_features", D.cox_durations_sorted_apart_from_features, c_index,
         "val C-index", f_sorted_apart, True),
        ("gan_real_data_outside_tanh_range", D.gan_real_data_outside_tanh_range, gan_w1, "W1 (data units)", f_tanh,
         False),
        ("cox_batch_size_one", D.cox_batch_size_one, c_index, "val C-index", f_bs1, True),
        ("diffusion_data_not_standardised", D.diffusion_data_not_standardised, eps, "val eps-MSE", f_unscaled,
         False)):
    fix(name, fixed_of(builder), metric, label, fact, steps=300, higher=higher)
