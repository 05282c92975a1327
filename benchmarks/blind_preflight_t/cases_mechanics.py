"""Set t, family mechanics: the optimisation itself is set up so that it cannot settle (a warm-up that never stops,
sums where means were tuned for, aggregation that multiplies the scale per layer, dropout that keeps 10%, a KL term
thousands of times heavier than the reconstruction)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.blind_preflight_t.cases_targets import gratings, sbm_graph
from benchmarks.blind_preflight_t.cases_trained import glyphs
from benchmarks.blind_preflight_t.registry import (
    acc_on,
    blobs,
    case,
    dev,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_on,
    seed,
    val_batches,
)


def cls_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(-1), b[-1].to(dev(m))

# --------------------------------------------------------------------------------------------------------------------
# Linear warm-up written as LambdaLR(lambda step: step / warmup) with no cap: the LR keeps growing after warm-up.


def two_spot_tiles(n: int, g: torch.Generator):
    """16x16 tiles with two spots; target: their mean position and separation (4 numbers in [0, 1]), noisy."""
    c0, b0 = blobs(n, 16, g)
    c1, b1 = blobs(n, 16, g)
    img = (b0 + b1)[:, None] + 0.3 * torch.randn(n, 1, 16, 16, generator=g)
    target = torch.cat([(c0 + c1) / 32, (c0 - c1).abs() / 16], 1)
    return img, target + 0.02 * torch.randn(target.shape, generator=g)


def spot_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 4))


@case("spot_cnn_warmup_lambda_never_capped", "mechanics",
      bug="The warm-up is LambdaLR(optimizer, lambda step: (step + 1) / warmup_steps) with no min(1, ...): after "
          "the 5 warm-up steps the factor keeps growing linearly, so by step 300 the SGD learning rate is 60x the "
          "intended 0.1 and the regression blows up.",
      cause_pattern=r"LambdaLR|lr_lambda|min\(1(\.0)?, |warm-?up .{0,60}(never|not|no|without) (a )?(cap|stop|end|plateau)|"
                    r"(learning rate|lr)\w* (keeps|continues to) (grow|increas|rise)|(grow|increas|rise)\w* "
                    r"(linearly|without (bound|limit|cap))|(not|never) capped|uncapped|without a cap|"
                    r"exceeds? the (base|initial|peak) (lr|learning rate)|"
                    r"\d+(\.\d+)?x the (base|initial|peak|intended) (lr|learning rate)")
def spot_cnn_warmup_lambda_never_capped(fixed: bool = False) -> dict:
    seed(0)
    x, y = two_spot_tiles(1500, gen(31))
    model = spot_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    warmup_steps = 5
    if fixed:
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup_steps))
    else:
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / warmup_steps)
    return dict(model=model, optimizer=optimizer, scheduler=schedule,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


def reg_fwd(m, b):
    d = dev(m)
    return m(b[0].to(d)), b[1].to(d)


fix("spot_cnn_warmup_lambda_never_capped", fixed_of(spot_cnn_warmup_lambda_never_capped), rmse_on(val_batches, reg_fwd),
    "val RMSE", steps=300, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# Graph convolution that sums the raw neighbourhood (A + I) @ H without degree normalisation, three layers deep.


class SumGCN(nn.Module):
    def __init__(self, adj: torch.Tensor, fixed: bool, d_in: int = 16, d_hid: int = 32, n_out: int = 4):
        super().__init__()
        a = adj + torch.eye(adj.shape[0])
        if fixed:
            d = a.sum(1).rsqrt()
            a = d[:, None] * a * d[None, :]
        self.register_buffer("a_hat", a)
        self.layers = nn.ModuleList([nn.Linear(d_in, d_hid), nn.Linear(d_hid, d_hid), nn.Linear(d_hid, n_out)])

    def forward(self, x):
        h = x
        for i, layer in enumerate(self.layers):
            h = self.a_hat @ layer(h)  # aggregate: node + neighbours
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h


@case("gcn_sum_aggregation_without_degree_norm", "mechanics",
      bug="The hand-written GCN aggregates with the raw (A + I) @ H instead of the degree-normalised "
          "D^-1/2 (A + I) D^-1/2, so with ~36 neighbours per node each of the three layers multiplies the feature "
          "scale by ~36: the logits start in the hundreds (0.1 when normalised) and SGD diverges.",
      cause_pattern=r"degree|normali[sz]\w* (the )?(adjacency|aggregation|a_hat|propagation)|D\^?-1/2|"
                    r"sym\w*[- ]norm|(sum|raw) (aggregation|adjacency)|\(A ?\+ ?I\)|"
                    r"(activations?|features?|logits?) .*(grow|explod|blow)\w*.*(layer|hop|aggregat)|"
                    r"(grow|explod|blow)\w* .*(per|each|every) (layer|hop)|mean aggregation|"
                    r"(logit|activation)s? .{0,40}(explod|blow)\w*")
def gcn_sum_aggregation_without_degree_norm(fixed: bool = False) -> dict:
    seed(0)
    g = gen(32)
    a, x, y = sbm_graph(600, 4, g, p_in=0.2, p_out=0.01)
    order = torch.randperm(600, generator=g)
    train_y, val_y = torch.full((600,), -100), torch.full((600,), -100)
    train_y[order[:300]], val_y[order[300:]] = y[order[:300]], y[order[300:]]
    model = SumGCN(a, fixed)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=DataLoader([(x, train_y)], batch_size=None),
                val_loader=DataLoader([(x, val_y)], batch_size=None),
                loss_fn=nn.CrossEntropyLoss(), max_steps=150)


def node_fwd(m, b):
    return m(b[0].to(dev(m))).argmax(-1), b[1].to(dev(m))


fix("gcn_sum_aggregation_without_degree_norm", fixed_of(gcn_sum_aggregation_without_degree_norm),
    acc_on(val_batches, node_fwd), "val node accuracy", steps=150)

# --------------------------------------------------------------------------------------------------------------------
# TF1 port: keep_prob = 0.9 passed to nn.Dropout, whose argument is the drop probability.


class GlyphMLP(nn.Module):
    def __init__(self, fixed: bool, keep_prob: float = 0.9):
        super().__init__()
        p = 1 - keep_prob if fixed else keep_prob
        self.net = nn.Sequential(nn.Linear(144, 128), nn.ReLU(), nn.Dropout(p), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Dropout(p), nn.Linear(128, 6))

    def forward(self, x):
        return self.net(x)


@case("glyph_mlp_keep_prob_as_dropout_p", "mechanics",
      bug="The model was ported from TensorFlow 1, where tf.nn.dropout takes keep_prob=0.9, and the value was passed "
          "as nn.Dropout(0.9); PyTorch's p is the probability of zeroing, so 90% of the hidden units are dropped at "
          "every training step.",
      cause_pattern=r"keep_prob|Dropout\(0\.9\)|p=0\.9|dropout (rate|probability|p)\w* .*(0\.9|90 ?%|too high|"
                    r"very high)|(90 ?%|0\.9) .*(dropped|zeroed|dropout)|drop(ping)? 90|1 ?- ?keep|"
                    r"probability (of|to) (zero|drop)")
def glyph_mlp_keep_prob_as_dropout_p(fixed: bool = False) -> dict:
    seed(0)
    noisy, _, y = glyphs(1500, gen(33))
    model = GlyphMLP(fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(noisy[:1000], y[:1000]), 32),
                val_loader=loader(TensorDataset(noisy[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=250)


fix("glyph_mlp_keep_prob_as_dropout_p", fixed_of(glyph_mlp_keep_prob_as_dropout_p), acc_on(val_batches, cls_fwd),
    "val accuracy", steps=250)

# --------------------------------------------------------------------------------------------------------------------
# x2 super-resolution with MSELoss(reduction="sum") and an SGD learning rate tuned for the mean.


class SubPixelSR(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                                  nn.ReLU(), nn.Conv2d(16, 4, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, lr_img):
        return self.body(lr_img)


def sr_pairs(n: int, g: torch.Generator):
    hr = torch.cat([gratings(n, g).reshape(n, 1, 8, 8), gratings(n, g).reshape(n, 1, 8, 8)], -1)
    hr = torch.cat([hr, hr.flip(-2)], -2)  # 16x16
    lr_img = F.avg_pool2d(hr, 2)
    return lr_img, hr


@case("superres_mse_sum_with_mean_tuned_lr", "mechanics",
      bug="The super-resolution loss is nn.MSELoss(reduction='sum') (copied from an SRResNet config) while the SGD "
          "learning rate 0.05 was tuned for the default mean: the gradient is 16 x 256 = 4096 times larger than "
          "intended, so the first updates overshoot and the weights diverge to inf/NaN.",
      cause_pattern=r"reduction ?= ?['\"]?sum|size_average|sum(med)? (over|of) (the )?(pixels|elements|batch)|"
                    r"(loss|gradient)s? .*(scale|grow)s? with (the )?(batch|number of (pixels|elements)|image size)|"
                    r"\d+x (larger|bigger)|(divid|averag)\w* by (the )?(batch|number of)|mean reduction|"
                    r"reduction ?= ?['\"]?mean")
def superres_mse_sum_with_mean_tuned_lr(fixed: bool = False) -> dict:
    seed(0)
    lr_img, hr = sr_pairs(1200, gen(34))
    model = SubPixelSR()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(lr_img[:1000], hr[:1000]), 16),
                val_loader=loader(TensorDataset(lr_img[1000:], hr[1000:]), 100, shuffle=False),
                loss_fn=nn.MSELoss() if fixed else nn.MSELoss(reduction="sum"), max_steps=250)


def sr_fwd(m, b):
    d = dev(m)
    return m(b[0].to(d)), b[1].to(d)


fix("superres_mse_sum_with_mean_tuned_lr", fixed_of(superres_mse_sum_with_mean_tuned_lr), rmse_on(val_batches, sr_fwd),
    "val HR RMSE", steps=250, higher=False)

# --------------------------------------------------------------------------------------------------------------------
# VAE: reconstruction as a mean over batch and pixels, KL summed over batch and latent dims (posterior collapse).


class GlyphVAE(nn.Module):
    def __init__(self, z_dim: int = 8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(144, 128), nn.ReLU())
        self.mu, self.logvar = nn.Linear(128, z_dim), nn.Linear(128, z_dim)
        self.dec = nn.Sequential(nn.Linear(z_dim, 128), nn.ReLU(), nn.Linear(128, 144))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return self.dec(z), mu, logvar


@case("vae_kl_summed_recon_averaged", "mechanics",
      bug="The VAE loss is F.mse_loss(recon, x) (a mean over the batch and the 144 pixels) plus the KL term summed "
          "over the batch and the latent dimensions, so the KL weighs ~4600 times more than in the ELBO; the "
          "encoder collapses to the prior and every reconstruction is the mean glyph.",
      cause_pattern=r"\bKL\b|kullback|posterior collapse|collaps\w* to the prior|beta|"
                    r"(recon\w*|mse) .*(mean|averag)\w*.*(kl|sum)|(kl|sum)\w*.*(recon\w*|mse) .*(mean|averag)|"
                    r"(inconsistent|mismatch\w*|different) (loss )?reductions?|reduction ?= ?['\"]?sum")
def vae_kl_summed_recon_averaged(fixed: bool = False) -> dict:
    seed(0)
    _, clean, _ = glyphs(1500, gen(35))

    def vae_loss(model, batch):
        x = batch[0]
        recon, mu, logvar = model(x)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        if fixed:
            kl = kl / x.numel()
        return F.mse_loss(recon, x) + kl

    model = GlyphVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(clean[:1200]), 32),
                val_loader=loader(TensorDataset(clean[1200:]), 100, shuffle=False),
                loss_fn=vae_loss, max_steps=300)


def vae_fwd(m, b):
    x = b[0].to(dev(m))
    return m(x)[0], x


fix("vae_kl_summed_recon_averaged", fixed_of(vae_kl_summed_recon_averaged), rmse_on(val_batches, vae_fwd),
    "val reconstruction RMSE", steps=300, higher=False)
