"""Set av, targets: the wrong thing regressed onto: a redrawn noise target, a generator told to look fake, inverted
censoring flags, hazard labels on every period, the wrong sign of the score."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.blind_preflight_av.registry import (
    GAN,
    Denoiser,
    Hazard,
    case,
    cox_loss,
    frozen_d,
    linear_alpha_bar,
    loader,
    mixture_2d,
    mlp,
    person_period,
    seed,
    split_ds,
    survival_data,
)


@case("diffusion_noise_target_redrawn", "targets",
      "The DDPM loss regresses the prediction onto a fresh torch.randn_like(x0) drawn after x_t was made, not onto "
      "the noise that was actually added to build x_t, so the target is independent of the input and the model "
      "learns to predict zero; reuse the same noise tensor for x_t and the target.",
      r"(re)?drawn? (again|twice|a second time|anew)|second (call to )?(torch\.)?randn|fresh (noise|randn)|"
      r"(different|new|independent|another|separate) noise|same noise|noise (that was |actually )?(used|added)|"
      r"target .{0,40}independent of .{0,20}input|not the noise")
def diffusion_noise_target_redrawn(fixed: bool = False):
    seed(0)
    x = mixture_2d(3000)
    train, val = split_ds(x, n_train=2500)
    model = Denoiser(dim=2, steps=100)

    def ddpm_loss(model, batch):
        x0 = batch[0]
        t = torch.randint(0, 100, (x0.shape[0],), device=x0.device)
        ab = linear_alpha_bar(100, x0.device)[t][:, None]
        noise = torch.randn_like(x0)
        x_t = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        target = noise if fixed else torch.randn_like(x0)
        return F.mse_loss(model(x_t, t), target)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=ddpm_loss, max_steps=300)


def gan_loss(fake_label_for_g: float = 1.0, detach_in_g: bool = False, d_live_in_g: bool = False):
    def loss(model, batch):
        real = batch[0].reshape(-1, 1)
        z = torch.randn(real.shape[0], model.z_dim, device=real.device)
        fake = model.G(z)
        d_real, d_fake = model.D(real), model.D(fake.detach())
        d_loss = (F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real))
                  + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake)))
        g_in = fake.detach() if detach_in_g else fake
        g_out = model.D(g_in) if d_live_in_g else frozen_d(model, g_in)
        g_loss = F.binary_cross_entropy_with_logits(g_out, torch.full_like(g_out, fake_label_for_g))
        return d_loss + g_loss
    return loss


def gan_data(n=3000, s=0):
    g = torch.Generator().manual_seed(s)
    return 3.0 + 0.5 * torch.randn(n, generator=g)


@case("gan_generator_trained_toward_fake_label", "targets",
      "The generator's loss uses the fake label: BCE(D(G(z)), zeros) instead of ones, so the generator is trained "
      "to be recognised as fake, cooperating with the discriminator instead of fooling it; the generator's target "
      "must be the real label (torch.ones_like).",
      r"(generator|g_loss|G).{0,80}(fake label|zeros|label 0|0 label|target 0)|"
      r"(real label|ones_like|label 1|target 1|labels? (of|=) ?1).{0,60}generator|generator.{0,80}(real label|ones)|"
      r"label (convention|flip)|flip\w* .{0,20}label|(cooperat|help)\w* .{0,30}discriminator")
def gan_generator_trained_toward_fake_label(fixed: bool = False):
    seed(0)
    x = gan_data()
    train, val = split_ds(x, n_train=2000)
    model = GAN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.5, 0.999))
    return dict(model=model, optimizer=opt, train_loader=loader(train, 128),
                val_loader=loader(val, 1000, shuffle=False),
                loss_fn=gan_loss(1.0 if fixed else 0.0), max_steps=300)


@case("cox_censoring_flag_used_as_event", "targets",
      "The table's censoring flag (1 = censored) is passed to the Cox partial likelihood as the event indicator, so "
      "censored subjects are treated as events and real events as censored; pass event = 1 - censored.",
      r"censor\w*.{0,60}(as|instead of|for) (the )?event|event.{0,60}(inverted|flipped|reversed|1 ?- ?censor)|"
      r"1 ?- ?censor|invert\w*|flip\w*|(is_)?censored.{0,40}(passed|used)|(events?|censor\w*) .{0,30}swapped|"
      r"wrong (event )?indicator")
def cox_censoring_flag_used_as_event(fixed: bool = False):
    seed(0)
    x, time, event = survival_data(2000, s=3, censor_rate=0.8)
    censored = 1.0 - event
    train, val = split_ds(x, time, event, n_train=1500)
    train_status = censored[:1500] if not fixed else event[:1500]
    train = torch.utils.data.TensorDataset(x[:1500], time[:1500], train_status)
    model = Hazard(8)

    def loss(model, batch):
        x, time, event = batch
        return cox_loss(model(x), time, event)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 256), val_loader=loader(val, 500, shuffle=False),
                loss_fn=loss, max_steps=300)


@case("hazard_labels_on_every_period", "targets",
      "In the person-period expansion every interval up to and including the event interval is labelled 1, instead "
      "of 1 only in the interval the event happens (0 in the intervals survived), so the discrete-time hazard is "
      "trained on a cumulative-incidence target and badly overestimated.",
      r"(every|all|each) (interval|period)s?.{0,60}(label|1|event)|(label|1|event).{0,60}(every|all|each) "
      r"(interval|period|row)|cumulative|only (in )?the (interval|period) (of|where|in which) the event|"
      r"survived (intervals|periods).{0,30}0|overestimat")
def hazard_labels_on_every_period(fixed: bool = False):
    seed(0)
    x, y_bad = person_period(1500, s=4, all_periods=True)
    _, y = person_period(1500, s=4)
    n = int(len(y) * 0.8)
    train, val = split_ds(x, y if fixed else y_bad, n_train=n)
    _, val = split_ds(x, y, n_train=n)
    model = Hazard(x.shape[1])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 256), val_loader=loader(val, 1000, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]).squeeze(-1), b[1]),
                max_steps=300)


class ScoreNet(torch.nn.Module):
    def __init__(self, sigmas):
        super().__init__()
        self.register_buffer("sigmas", sigmas)
        self.net = mlp(2 + 1, 2, 128, depth=3)

    def forward(self, x, i):
        sigma = self.sigmas[i][:, None]
        return self.net(torch.cat([x, sigma.log()], dim=-1)) / sigma


SIGMAS = torch.exp(torch.linspace(0.0, -3.0, 10))


@case("dsm_score_target_sign", "targets",
      "Denoising score matching regresses the score onto +noise / sigma, but the score of the noised data at "
      "x + sigma * noise is -noise / sigma (it points back toward the data); the wrong sign trains a score that "
      "pushes samples away from the data.",
      r"sign|-\s?noise ?/ ?sigma|minus|negat\w*|points? (back )?(toward|towards|to) the data|away from the data|"
      r"-\s?\(x_noisy - x\)")
def dsm_score_target_sign(fixed: bool = False):
    seed(0)
    x = mixture_2d(3000)
    train, val = split_ds(x, n_train=2500)
    model = ScoreNet(SIGMAS)

    def dsm(model, batch):
        x = batch[0]
        i = torch.randint(0, len(model.sigmas), (x.shape[0],), device=x.device)
        sigma = model.sigmas[i][:, None]
        noise = torch.randn_like(x)
        target = -noise / sigma if fixed else noise / sigma
        score = model(x + sigma * noise, i)
        return ((sigma * (score - target)) ** 2).sum(-1).mean()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(train, 128), val_loader=loader(val, 500, shuffle=False),
                loss_fn=dsm, max_steps=300)
