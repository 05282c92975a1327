"""Set aj, family ``mechanics``: loss reduction and weighting, scheduler, precision and parameter-group slips."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_aj.cases_shapes import KeywordCNN, spectrograms
from benchmarks.blind_preflight_aj.registry import (
    acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    mean_over,
    rmse_of,
    seed,
    teacher_classes,
    teacher_regression,
)

# --------------------------------------------------------------------------------------------------------------------
# 1. VAE on sensor spectra: reconstruction averaged per element, KL summed over batch and latent

def spectra(n: int, s: int, d: int = 64):
    """Smooth 64-bin spectra made of two peaks whose positions and heights vary (a 4-factor manifold), in [0, 1]."""
    g = gen(s)
    f = torch.linspace(0, 1, d)
    c = torch.rand(n, 2, generator=g) * 0.8 + 0.1
    h = torch.rand(n, 2, generator=g) * 0.7 + 0.3
    return (h[:, :1] * torch.exp(-((f - c[:, :1]) / 0.06) ** 2) + h[:, 1:] * torch.exp(-((f - c[:, 1:]) / 0.06) ** 2)
            ).clamp(0, 1)


class SpectrumVAE(nn.Module):
    def __init__(self, d: int = 64, z: int = 4):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 128), nn.ReLU())
        self.mu, self.logvar = nn.Linear(128, z), nn.Linear(128, z)
        self.dec = nn.Sequential(nn.Linear(z, 128), nn.ReLU(), nn.Linear(128, d), nn.Sigmoid())

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return self.dec(z), mu, logvar


def elbo(per_sample: bool):
    def loss_fn(model, batch):
        (x,) = batch
        recon, mu, logvar = model(x)
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        if per_sample:
            return (F.mse_loss(recon, x, reduction="sum") / 0.01 + kl) / x.shape[0]
        return F.mse_loss(recon, x) + kl
    return loss_fn


def recon_rmse(model, kw) -> float:
    def fn(m, b):
        (x,) = b
        recon = m(x.to(next(m.parameters()).device))[0].float().cpu()
        return ((recon - x) ** 2).sum().item(), x.numel()
    return mean_over(model, kw["val_loader"], fn) ** 0.5


@case("aj_vae_kl_sum_recon_mean", "mechanics",
      bug="The VAE loss adds F.mse_loss(recon, x), a mean over all 64 bins and the batch, to a KL term summed over "
          "the batch and the latent dimensions: the KL is weighted thousands of times more than the reconstruction, "
          "the posterior collapses to the prior and every spectrum decodes to the average spectrum.",
      cause_pattern=r"(KL|kl_?div\w*|Kullback)\W.{0,100}(sum|mean|average|reduc|scale|weigh|dominat|balanc)|"
                    r"(reduction|mean|sum)\W.{0,80}(KL|Kullback)|posterior collapse|(reconstruction|recon)\w*\W.{0,80}"
                    r"(mean|sum|reduc|scale|weigh|outweigh|dominat|imbalanc)")
def vae_kl_sum(fixed: bool = False):
    seed(0)
    x = spectra(1500, 1)
    model = SpectrumVAE()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:]), 100, shuffle=False),
                loss_fn=elbo(per_sample=fixed), max_steps=800)


fix("aj_vae_kl_sum_recon_mean", fixed_of(vae_kl_sum), recon_rmse, "val reconstruction RMSE", steps=400,
    higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 2. rare-fault detection: BCEWithLogitsLoss(pos_weight = n_pos / n_neg), the inverse of the balancing weight

def fault_readings(n: int, s: int, d: int = 10, rate: float = 0.1):
    g = gen(s)
    y = (torch.rand(n, generator=g) < rate).float()
    shift = torch.zeros(d)
    shift[:4] = 0.9
    return torch.randn(n, d, generator=g) + y[:, None] * shift, y


def balanced_accuracy(model, kw) -> float:
    was = model.training
    model.eval()
    preds, ys = [], []
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            preds.append((model(x.to(next(model.parameters()).device)).float().cpu().squeeze(-1) > 0).float())
            ys.append(y)
    model.train(was)
    p, y = torch.cat(preds), torch.cat(ys)
    return 0.5 * ((p[y == 1] == 1).float().mean() + (p[y == 0] == 0).float().mean()).item()


@case("aj_fault_pos_weight_inverted", "mechanics",
      bug="Faults are 10% of the readings and the user balances BCEWithLogitsLoss with pos_weight = n_pos / n_neg "
          "(about 0.11) instead of n_neg / n_pos (about 9): the rare positive class is down-weighted nine-fold "
          "more, and the detector all but never flags a fault.",
      cause_pattern=r"pos_weight\W.{0,80}(invert|revers|reciprocal|upside|wrong way|below 1|< ?1\b|less than 1|0\.1\d*|"
                    r"n_?pos\s*/\s*n_?neg)|n_?neg\w*\s*/\s*n_?pos|n_?pos\w*\s*/\s*n_?neg|negatives?\s*/\s*positives?|"
                    r"(positive|minority|rare) (class )?(is )?(down-?weight|weighted (down|less))|down-?weight\w*\W.{0,40}"
                    r"(positive|minority|rare|fault)")
def fault_pos_weight(fixed: bool = False):
    seed(0)
    x, y = fault_readings(3000, 2)
    xtr, ytr = x[:2400], y[:2400]
    n_pos, n_neg = ytr.sum(), (1 - ytr).sum()
    pos_weight = (n_neg / n_pos) if fixed else (n_pos / n_neg)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    pos_weight = pos_weight.reshape(1)

    def loss_fn(model, batch):
        logits = model(batch[0]).squeeze(-1)
        return F.binary_cross_entropy_with_logits(logits, batch[1], pos_weight=pos_weight.to(logits.device))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(xtr, ytr), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=loss_fn, max_steps=600)


fix("aj_fault_pos_weight_inverted", fixed_of(fault_pos_weight), balanced_accuracy, "val balanced accuracy",
    steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 3. LambdaLR whose lambda returns the learning rate itself instead of a factor

@case("aj_lambdalr_returns_lr_not_factor", "mechanics",
      bug="The decay schedule is LambdaLR(optimizer, lambda step: 3e-3 * 0.5 ** (step / 200)): LambdaLR multiplies "
          "the optimizer's lr=3e-3 by what the lambda returns, so the effective learning rate is 9e-6 and decays from "
          "there; the lambda must return a factor (0.5 ** (step / 200)).",
      cause_pattern=r"LambdaLR|lr_lambda|(multiplicative )?factor\W.{0,60}(not|instead of|rather than) (the |a )?"
                    r"(learning rate|lr)|(learning rate|lr)\W.{0,40}(multiplied|applied|scaled) twice|"
                    r"(learning rate|lr)\w*\W.{0,40}squared|(effective|actual) (learning rate|lr)\W.{0,60}"
                    r"(tiny|too (small|low)|\d(\.\d+)?e-0?[5-9])")
def lambdalr_returns_lr(fixed: bool = False):
    seed(0)
    x, y = teacher_classes(1500, 20, 6, s=3)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 6))
    base_lr = 3e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    if fixed:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** (step / 200))
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: base_lr * 0.5 ** (step / 200))
    return dict(model=model, optimizer=optimizer, scheduler=scheduler,
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=600)


fix("aj_lambdalr_returns_lr_not_factor", fixed_of(lambdalr_returns_lr),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy", steps=300)


# --------------------------------------------------------------------------------------------------------------------
# 4. "bf16 training" done by casting the whole model to bfloat16: Adam's small updates round away

class BF16Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype)).float().squeeze(-1)


@case("aj_pure_bf16_weights_updates_lost", "mechanics",
      bug="For bf16 training the user calls model.to(torch.bfloat16), so the weights themselves are bfloat16 (8 "
          "mantissa bits) and AdamW at lr=1e-4 proposes updates far below half a bf16 step for weights of size "
          "0.1-0.3: the updates round to nothing and the weights barely move (no fp32 master weights).",
      cause_pattern=r"(bfloat16|bf16)\W.{0,40}(weights|parameters|master|mantissa)|(weights?|parameters?)\W.{0,60}"
                    r"(bfloat16|bf16|low precision|half precision)|master weights|(updates?|steps?)\W.{0,60}(round\w* "
                    r"(to|away|off)|lost|swallowed|below (the )?(resolution|precision|spacing))|model\.(to\(torch\."
                    r"bfloat16\)|bfloat16\(\)|half\(\))|keep (the )?(weights|parameters) in (fp32|float32)")
def pure_bf16(fixed: bool = False):
    seed(0)
    x, y = teacher_regression(1500, 16, s=4)
    model = BF16Regressor()
    if not fixed:
        model = model.to(torch.bfloat16)
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 32),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 100, shuffle=False),
                loss_fn=lambda model, batch: F.mse_loss(model(batch[0]), batch[1]),
                precision="bf16", max_steps=800)


fix("aj_pure_bf16_weights_updates_lost", fixed_of(pure_bf16), rmse_of(lambda m, b: (m(b[0]), b[1])), "val RMSE",
    steps=400, higher=False)


# --------------------------------------------------------------------------------------------------------------------
# 5. layer-wise learning rates through an 'lr_scale' key that torch.optim never reads

@case("aj_param_group_lr_scale_ignored", "mechanics",
      bug="The new classifier head of a keyword-spotting CNN is meant to train 100x faster than the backbone and is "
          "given as AdamW param group {'params': head, 'lr_scale': 100.0} with lr=1e-5: torch.optim ignores the "
          "unknown 'lr_scale' key (only a scheduler from another codebase applied it), so the head trains at 1e-5 "
          "and barely moves.",
      cause_pattern=r"lr_scale|(unknown|unused|unrecogni[sz]ed|ignored|extra) (param(eter)?[ _]group )?(key|option|entry|"
                    r"field)|(key|entry)\W.{0,40}(ignored|never read|not read|has no effect)|(head|classifier)\W.{0,80}"
                    r"(learning rate|lr)\W.{0,40}(too (small|low)|1e-0?5|tiny|same as the backbone)")
def lr_scale_ignored(fixed: bool = False):
    seed(0)
    spec, y = spectrograms(1300, 7)
    model = KeywordCNN(softmax_dim=1)
    head_group = {"params": model.head.parameters(), "lr": 1e-3} if fixed else \
        {"params": model.head.parameters(), "lr_scale": 100.0}
    optimizer = torch.optim.AdamW([{"params": model.features.parameters()}, head_group], lr=1e-5)
    return dict(model=model, optimizer=optimizer,
                train_loader=loader(TensorDataset(spec[:1000], y[:1000]), 32),
                val_loader=loader(TensorDataset(spec[1000:], y[1000:]), 100, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=600)


fix("aj_param_group_lr_scale_ignored", fixed_of(lr_scale_ignored), acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])),
    "val accuracy", steps=300)
