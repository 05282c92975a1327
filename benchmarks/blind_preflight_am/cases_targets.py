"""Set am, family targets: what the model is asked to fit (target scale, window labels, survival risk sets, class
weights, quantile losses)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_am.registry import case, fix, fixed_of, gen, loader, mean_over, r2_of, rmse_of, seed

# ---------------------------------------------------------------------------------------------------------------


def house_prices(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g) / 8 ** 0.5
    price = 250_000 + 60_000 * (torch.tanh(x @ w) + 0.3 * x[:, 0] * x[:, 1]) + 5_000 * torch.randn(n, generator=g)
    return x, price


@case("am_unscaled_price_target", "targets",
      "House prices are regressed in raw dollars (mean about 250,000, std about 60,000) with nn.MSELoss and "
      "Adam(lr=1e-3) while the features are standardised: the output starts near 0 and Adam moves each weight about "
      "lr per step, so after hundreds of steps the predictions are still tens of thousands of times too small.",
      r"(target|label|price|y)\w*.{0,100}(mean|scale|magnitude|std|around|about|~|=|of)\s*.{0,20}(2\.5\d*\s*e\+?0?5|"
      r"250[, ]?000|6\.0?\d*\s*e\+?0?4|60[, ]?000)|raw dollars|(output|prediction)\w*.{0,80}(orders? of magnitude|"
      r"\d+x|thousands of times) (below|smaller|too small|off)|(Adam|lr|learning rate).{0,120}(never reach|cannot reach|"
      r"can't reach|too slow to reach).{0,40}(target|label|scale|mean)")
def unscaled_price_target(fixed: bool = False):
    seed(0)
    x, y = house_prices(2400, 11)
    if fixed:
        y = (y - y[:2000].mean()) / y[:2000].std()
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_unscaled_price_target", fixed_of(unscaled_price_target), r2_of(lambda m, b: (m(b[0]), b[1])),
    "val R^2 (in the units trained on)")

# ---------------------------------------------------------------------------------------------------------------


def ar2_series(n: int, s: int):
    g = gen(s)
    e = torch.randn(n + 50, generator=g)
    z = torch.zeros(n + 50)
    for t in range(2, n + 50):
        z[t] = 1.2 * z[t - 1] - 0.8 * z[t - 2] + 0.5 * e[t]
    return z[50:]


def windows(series, length: int, label_offset: int):
    idx = torch.arange(len(series) - length - 1)
    x = torch.stack([series[i:i + length] for i in idx])
    y = torch.stack([series[i + label_offset] for i in idx])
    return x, y


@case("am_window_label_is_last_input", "targets",
      "The training windows are built with y = series[i + window - 1] (an off-by-one in the sliding-window loop): the "
      "label is the last value already inside the input window, so the forecaster learns to copy its last input "
      "instead of predicting the next step.",
      r"(off.by.one|last (value|step|element|observation|input) (of|in|inside|already in) (the )?(input|window)|"
      r"label\w* (is|equals?|=) (the )?last (input|value|step)|label.{0,60}(inside|within|contained in|part of) "
      r"(the )?(input )?window|i ?\+ ?window ?- ?1|copy\w* (its |the )?(last|final) input|"
      r"(shift|offset)\w*.{0,40}(label|target)\w*.{0,40}(by )?one|next.step.{0,60}(label|target).{0,60}window)")
def window_label_is_last_input(fixed: bool = False):
    seed(0)
    z = ar2_series(3000, 12)
    x, y = windows(z[:2400], 12, 12 if fixed else 11)
    xv, yv = windows(z[2400:], 12, 12)                  # the evaluation code uses the library windowing helper
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_window_label_is_last_input", fixed_of(window_label_is_last_input), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE of the next step", higher=False)

# ---------------------------------------------------------------------------------------------------------------


def survival(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g) / 8 ** 0.5
    risk = x @ w + 0.5 * x[:, 0] ** 2
    t_event = -torch.log(torch.rand(n, generator=g)) / torch.exp(risk)
    t_cens = -torch.log(torch.rand(n, generator=g)) / 0.4
    time = torch.minimum(t_event, t_cens)
    event = (t_event <= t_cens).float()
    return x, time, event


def cox_loss(descending: bool):
    def loss(model, batch):
        x, time, event = batch
        risk = model(x).squeeze(-1)
        order = torch.argsort(time, descending=descending)
        risk, event = risk[order], event[order]
        log_risk_set = torch.logcumsumexp(risk, dim=0)
        return -((risk - log_risk_set) * event).sum() / event.sum().clamp(min=1.0)
    return loss


def c_index(model, kw):
    xs, ts, es = [], [], []
    for x, t, e in kw["val_loader"]:
        xs.append(x), ts.append(t), es.append(e)
    x, t, e = torch.cat(xs), torch.cat(ts), torch.cat(es)
    was = model.training
    model.eval()
    with torch.no_grad():
        r = model(x.to(next(model.parameters()).device)).squeeze(-1).float().cpu()
    model.train(was)
    comparable = (t[:, None] < t[None, :]) & (e[:, None] == 1)
    concordant = (r[:, None] > r[None, :]).float() + 0.5 * (r[:, None] == r[None, :]).float()
    return float((concordant * comparable).sum() / comparable.sum())


@case("am_cox_risk_set_ascending", "targets",
      "The DeepSurv-style Cox partial likelihood sorts the batch by time ascending before torch.logcumsumexp, so each "
      "event's 'risk set' is the subjects who already failed (time <= t_i) instead of those still at risk "
      "(time >= t_i); the loss rewards the wrong ordering.",
      r"(ascending|descending|sort\w*.{0,60}(time|duration)|argsort|risk.set|at risk|already (failed|died|had)|"
      r"(cumsum|cumulative sum|logcumsumexp).{0,80}(order|direction|revers|flip))")
def cox_risk_set_ascending(fixed: bool = False):
    seed(0)
    x, time, event = survival(2500, 13)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], time[:2000], event[:2000]), 256),
                val_loader=loader(TensorDataset(x[2000:], time[2000:], event[2000:]), 500, shuffle=False),
                loss_fn=cox_loss(descending=fixed), max_steps=300)


fix("am_cox_risk_set_ascending", fixed_of(cox_risk_set_ascending), c_index, "val C-index")

# ---------------------------------------------------------------------------------------------------------------


def fraud(n: int, s: int):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=g)
    score = x @ w / 10 ** 0.5 + 0.3 * torch.randn(n, generator=g)
    y = (score > torch.quantile(score, 0.96)).float()
    return x, y


def balanced_acc(model, kw):
    def fn(m, b):
        p = (m(b[0]) > 0).float()
        y = b[1]
        return torch.stack([(p * y).sum(), ((1 - p) * (1 - y)).sum(), y.sum(), (1 - y).sum()]), 1
    tp = tn = pos = neg = 0.0
    was = model.training
    model.eval()
    with torch.no_grad():
        for b in kw["val_loader"]:
            s, _ = fn(model, b)
            tp, tn, pos, neg = tp + s[0].item(), tn + s[1].item(), pos + s[2].item(), neg + s[3].item()
    model.train(was)
    return 0.5 * (tp / max(pos, 1) + tn / max(neg, 1))


@case("am_pos_weight_inverted", "targets",
      "For a 4%-positive fraud label, BCEWithLogitsLoss gets pos_weight = n_pos / n_neg (about 0.04) instead of "
      "n_neg / n_pos (about 24): the rare positives are down-weighted 25x more instead of up-weighted, and the model "
      "predicts 'no fraud' for everything.",
      r"(pos_weight|positive (class )?weight).{0,120}(invert|revers|flip|upside|n_neg ?/ ?n_pos|neg\w* ?/ ?pos|"
      r"less than 1|< ?1|down.?weight|too small)|(n_pos ?/ ?n_neg|pos\w* ?/ ?neg\w*)|"
      r"(invert|revers|flip)\w*.{0,40}(class )?(weight|ratio)")
def pos_weight_inverted(fixed: bool = False):
    seed(0)
    x, y = fraud(6000, 14)
    n_pos, n_neg = y[:5000].sum(), (1 - y[:5000]).sum()
    pos_weight = (n_neg / n_pos) if fixed else (n_pos / n_neg)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:5000], y[:5000]), 128),
                val_loader=loader(TensorDataset(x[5000:], y[5000:]), 500, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight.reshape(1)), max_steps=400)


fix("am_pos_weight_inverted", fixed_of(pos_weight_inverted), balanced_acc, "val balanced accuracy")

# ---------------------------------------------------------------------------------------------------------------


def hetero(n: int, s: int):
    g = gen(s)
    x = torch.rand(n, 4, generator=g) * 2 - 1
    y = torch.sin(2 * x[:, 0]) + (0.2 + 0.8 * x[:, 1].abs()) * torch.randn(n, generator=g)
    return x, y


def pinball(q: float, fixed: bool):
    def loss(model, batch):
        x, y = batch
        err = y - model(x)
        if fixed:
            return torch.maximum(q * err, (q - 1) * err).mean()
        return torch.maximum((1 - q) * err, -q * err).mean()
    return loss


def coverage_error(model, kw):
    def fn(m, b):
        return (b[1] <= m(b[0])).float().sum().item(), b[1].numel()
    return abs(mean_over(model, kw["val_loader"], fn) - 0.9)


@case("am_pinball_quantile_swapped", "targets",
      "The pinball (quantile) loss for the P90 demand head is written max((1 - q) * err, -q * err) with err = y - "
      "pred: q and 1 - q are swapped, so the head is trained toward the 10th percentile instead of the 90th.",
      r"(pinball|quantile).{0,120}(swap|revers|invert|flip|1 ?- ?q|wrong (sign|side|tail)|10th|0\.1\b|P10)|"
      r"(swap|revers|invert|flip)\w*.{0,60}(q\b|quantile|tau)|1 ?- ?(q|tau)\b.{0,40}(q|tau)\b")
def pinball_quantile_swapped(fixed: bool = False):
    seed(0)
    x, y = hetero(3000, 15)
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2500], y[:2500]), 128),
                val_loader=loader(TensorDataset(x[2500:], y[2500:]), 500, shuffle=False),
                loss_fn=pinball(0.9, fixed), max_steps=400)


fix("am_pinball_quantile_swapped", fixed_of(pinball_quantile_swapped), coverage_error,
    "|P90 coverage - 0.9| on val", higher=False)
