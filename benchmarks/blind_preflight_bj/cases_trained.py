"""Family ``what_is_trained``: which parts of a forecaster / detector actually learn."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bj.models import GRUForecaster
from benchmarks.blind_preflight_bj.registry import (case, fix, fixed_of, gen, loader, loaders, mae_of, mlp, seed,
                                                    series, time_split, val_mae, windows)

L = 24


@case("w_head_replaced_after_optim", "what_is_trained",
      "The forecaster's head is replaced (model.head = nn.Linear(hidden, 6) for a 6-step horizon) after the optimizer "
      "was built from model.parameters(), so the optimizer holds the old head and the new head is never updated.",
      r"(head|layer|module).{0,80}(replac|reassign|swapp|re-?creat|overwr).{0,80}after.{0,40}optim|"
      r"optim\w*.{0,80}(before|prior to).{0,80}(head|layer|module).{0,40}(replac|reassign|swap|creat|chang)|"
      r"(new|replaced|reassigned) (head|layer|module).{0,80}(not|never).{0,40}(in the optimi|updated|trained|registered)")
def w_head_replaced_after_optim(fixed=False):
    seed(20)
    tr, va = time_split(series(s=20))
    model = GRUForecaster(1, hid=8)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    model.head = nn.Linear(8, 6)
    if fixed:
        opt = torch.optim.Adam(model.parameters(), 3e-3)
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=opt, train_loader=tl, loss_fn=nn.MSELoss(), val_loader=vl)


fix("w_head_replaced_after_optim", fixed_of(w_head_replaced_after_optim), val_mae, "val MAE", higher=False)


class Bottleneck(nn.Module):
    def __init__(self, detach):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(L, 64), nn.ReLU(), nn.Linear(64, 4))
        self.head = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 6))
        self.detach = detach

    def forward(self, x):
        z = self.enc(x)
        return self.head(z.detach() if self.detach else z)


@case("w_encoder_detached", "what_is_trained",
      "The forecaster detaches the encoder's 4-d window embedding (z.detach()) before the forecasting head, so no "
      "gradient reaches the encoder and it stays at its random initialisation.",
      r"detach|(no|zero) gradient.{0,60}(encoder|embedding|backbone)|(encoder|embedding|backbone).{0,80}"
      r"(cut|disconnect|stop\w*|block\w*|never (updated|trained|learn)|random init|untrained|frozen by)|stop[- ]gradient")
def w_encoder_detached(fixed=False):
    seed(21)
    tr, va = time_split(series(s=21))
    model = Bottleneck(detach=not fixed)
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("w_encoder_detached", fixed_of(w_encoder_detached), val_mae, "val MAE", higher=False)

H = 4


class CovariateForecaster(nn.Module):
    """Lags branch + known-future covariate branch (promotion flags of the horizon steps)."""

    def __init__(self, fixed):
        super().__init__()
        self.lags = mlp(L, H)
        self.cov = nn.Sequential(nn.Linear(H, 32), nn.ReLU(), nn.Linear(32, H))
        self.fixed = fixed

    def forward(self, x):
        hist, promo = x[:, :L], x[:, L:]
        mu = hist.mean(1, keepdim=True)
        if self.fixed:
            c = self.cov(promo)
        else:
            with torch.no_grad():
                c = self.cov(promo)
        return self.lags(hist - mu) + mu + c


def promo_windows(x, promo):
    w = x.unfold(1, L + H, 1).reshape(-1, L + H)
    p = promo.unfold(1, L + H, 1).reshape(-1, L + H)
    return torch.cat([w[:, :L], p[:, L:]], 1), w[:, L:].contiguous()


@case("w_no_grad_covariates", "what_is_trained",
      "The forward pass computes the known-future covariate (promotion) branch inside torch.no_grad(), meant only for "
      "the window statistics, so the covariate branch gets no gradient and keeps its random weights.",
      r"no_grad|inference_mode|(covariate|promo\w*|exogenous|calendar).{0,80}(branch|net|layer|module|encoder).{0,80}"
      r"(no gradient|not trained|never (trained|updated|learn)|random|untrained|without grad)|"
      r"(gradient|grad).{0,40}(disabled|switched off|turned off).{0,60}(covariate|promo|branch)")
def w_no_grad_covariates(fixed=False):
    seed(22)
    base = series(s=22)
    promo = (torch.rand(base.shape, generator=gen(22)) < 0.3).float()
    x = base + 2.0 * promo
    (tr, va), (ptr, pva) = time_split(x), time_split(promo)
    model = CovariateForecaster(fixed)
    tl, vl = loaders(promo_windows(tr, ptr), promo_windows(va, pva))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("w_no_grad_covariates", fixed_of(w_no_grad_covariates), val_mae, "val MAE", higher=False)


def anomaly_windows(s, n_normal=1500, n_val=600, frac_val=0.2, contaminate=0.0, Lw=32, bump_size=2.5):
    """Normal seasonal windows; anomalies carry a fixed bump; returns train windows (x,), val windows and labels."""
    g = gen(s)
    x = series(S=1, T=n_normal + n_val + Lw * 2, s=s)[0]
    w = x.unfold(0, Lw, 1)
    bump = torch.zeros(Lw)
    bump[10:16] = bump_size
    tr = w[:n_normal].clone()
    tr_lab = (torch.rand(len(tr), generator=g) < contaminate)
    tr[tr_lab] += bump
    va = w[n_normal + Lw:n_normal + Lw + n_val].clone()
    lab = (torch.rand(len(va), generator=g) < frac_val)
    va[lab] += bump
    return tr, tr_lab, va, lab.long()


def ae_loss(model, batch):
    x = batch[0]
    return ((model(x) - x) ** 2).mean()


def ae_loaders(tr, va, lab):
    from torch.utils.data import TensorDataset
    tl = loader(TensorDataset(tr), 32, shuffle=True)
    vl = loader(TensorDataset(va), 128, shuffle=False)
    vl.anomaly_labels = lab
    return tl, vl


class BackcastForecast(nn.Module):
    """N-BEATS-style block: a shared trunk with a backcast head (L values) and a forecast head (6 values)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(L, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.backcast = nn.Linear(64, L)
        self.forecast = nn.Linear(64, 6)

    def forward(self, x):
        z = self.trunk(x)
        return self.backcast(z), self.forecast(z)


def backcast_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        out = model(x)
        pred = out[1] if fixed else out[0][:, :6]
        return ((pred - y) ** 2).mean()
    return loss_fn


@case("w_forecast_head_untrained", "what_is_trained",
      "The loss takes the first element of the (backcast, forecast) tuple (out[0][:, :6]) instead of the forecast "
      "out[1], so the forecast head never receives a gradient and stays random while the backcast head is fitted to "
      "the horizon.",
      r"out\w*\[0\]|out\w*\[1\]|(tuple|outputs?).{0,60}(wrong|first) (element|index|item|output)|"
      r"(forecast) (head|output|branch).{0,80}(never|not|no gradient|untrained|random|unused)|"
      r"backcast.{0,80}(instead of|rather than|in place of|trained|fitted|used).{0,40}forecast")
def w_forecast_head_untrained(fixed=False):
    seed(23)
    tr, va = time_split(series(s=23))
    model = BackcastForecast()
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=backcast_loss(fixed), val_loader=vl)


fix("w_forecast_head_untrained", fixed_of(w_forecast_head_untrained), mae_of(lambda m, b: (m(b[0])[1], b[1])),
    "val MAE of the forecast head", higher=False)


@case("w_shared_horizon_heads", "what_is_trained",
      "The per-horizon heads are built as nn.ModuleList([nn.Linear(hidden, 1)] * H), which repeats one Linear module "
      "H times, so every horizon step shares one head and predicts the same value.",
      r"\[.{0,40}\] ?\* ?H|list multiplication|\* ?H\b|(same|one|single|shared?) (linear |output )?(module|head|layer|"
      r"instance|object).{0,80}(repeat|every|all|each|shared|reused|H times)|(heads?).{0,60}(share|alias|same object|"
      r"identical).{0,60}(weight|param|horizon)")
def w_shared_horizon_heads(fixed=False):
    seed(24)
    tr, va = time_split(series(s=24))
    heads = nn.ModuleList([nn.Linear(32, 1) for _ in range(6)] if fixed else [nn.Linear(32, 1)] * 6)
    model = GRUForecaster(6, heads=heads)
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("w_shared_horizon_heads", fixed_of(w_shared_horizon_heads), val_mae, "val MAE", higher=False)
