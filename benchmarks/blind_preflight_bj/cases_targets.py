"""Family ``targets``: horizon targets built, scaled or masked wrongly."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight_bj.models import Seq2Seq
from benchmarks.blind_preflight_bj.registry import (case, fix, fixed_of, gen, loaders, mae_of, mlp, pinball, seed,
                                                    series, time_split, val_mae, windows)

L, H = 24, 3


@case("t_off_by_one_horizon", "targets",
      "The training windows take the horizon targets from w[:, L-1:L-1+H] instead of w[:, L:L+H], so the first "
      "target is the last input value and every target is one step too early.",
      r"off[- ]by[- ]one|one (time ?)?step (too )?(early|behind|late|shift)|shift\w*.{0,40}(by )?one|"
      r"L ?- ?1|(first )?target.{0,60}(equal|is|copies|same as|overlap).{0,40}(last|final) input|"
      r"(target|horizon|label)s?.{0,60}(misalign|start.{0,20}(early|inside|within))")
def t_off_by_one_horizon(fixed=False):
    seed(10)
    tr, va = time_split(series(s=10))
    w = tr.unfold(1, L + H + 1, 1).reshape(-1, L + H + 1)
    x = w[:, 1:L + 1]
    y = w[:, L + 1:] if fixed else w[:, L:L + H]
    model = mlp(L, H)
    tl, vl = loaders((x.contiguous(), y.contiguous()), windows(va, L, H))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("t_off_by_one_horizon", fixed_of(t_off_by_one_horizon), val_mae, "val MAE", higher=False)


def _stats(x):
    return x.mean(1, keepdim=True), x.std(1, keepdim=True) + 1e-3


def own_norm_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        mu, sd = _stats(x)
        ymu, ysd = (mu, sd) if fixed else _stats(y)
        return ((model((x - mu) / sd) - (y - ymu) / ysd) ** 2).mean()
    return loss_fn


def denorm_fwd(m, b):
    x, y = b
    mu, sd = _stats(x)
    return m((x - mu) / sd) * sd + mu, y


@case("t_target_norm_own_stats", "targets",
      "Per-window normalisation scales the horizon target with its own mean and std instead of the input window's "
      "statistics, so the normalised target loses its level and scale and the forecast cannot be inverted with the "
      "input window's statistics.",
      r"(target|horizon|y)\b.{0,80}(own|its own|separate|their own).{0,40}(mean|std|stat|scal|normali)|"
      r"(normali[sz]\w*|scal\w*).{0,80}(target|horizon).{0,80}(input|context|history|lookback|encoder) window|"
      r"(input|context|lookback|history).{0,40}(window'?s? )?(mean|std|stat\w*).{0,80}(target|horizon|y\b)")
def t_target_norm_own_stats(fixed=False):
    seed(11)
    tr, va = time_split(series(S=8, s=11, level=5.0, spread=40.0, noise=0.3))
    model = mlp(L, H)
    tl, vl = loaders(windows(tr, L, H, 2), windows(va, L, H))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=own_norm_loss(fixed), val_loader=vl)


fix("t_target_norm_own_stats", fixed_of(t_target_norm_own_stats), mae_of(denorm_fwd), "val MAE (raw scale)",
    higher=False)

QS = torch.tensor([0.1, 0.5, 0.9])


def signed_pinball(fixed):
    def loss_fn(model, batch):
        x, y = batch
        pred = model(x)                     # (B, Q) for a one-step horizon
        e = (y - pred) if fixed else (pred - y)
        return torch.maximum(QS * e, (QS - 1) * e).mean()
    return loss_fn


@case("t_quantile_sign", "targets",
      "The pinball loss uses the error pred - y instead of y - pred, so the 0.1 output learns the 0.9 quantile and "
      "vice versa (the quantile levels are inverted).",
      r"pred\w* ?- ?y|y ?- ?pred|(sign|error|residual).{0,50}(flip|invert|revers|swap|wrong|negat)|"
      r"(quantile|tau|q)s?.{0,60}(swap|invert|revers|mirror|1 ?- ?q|1 ?- ?tau|crossed)")
def t_quantile_sign(fixed=False):
    seed(12)
    tr, va = time_split(series(s=12, noise=0.6))
    model = mlp(L, 3)
    tl, vl = loaders(windows(tr, L, 1), windows(va, L, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=signed_pinball(fixed), val_loader=vl)


def val_pinball(model, kw):
    from benchmarks.blind_preflight_bj.registry import mean_over
    return mean_over(model, kw["val_loader"], lambda m, b: (pinball(m(b[0]), b[1][:, 0], QS).item() * len(b[0]),
                                                            len(b[0])))


fix("t_quantile_sign", fixed_of(t_quantile_sign), val_pinball, "val pinball loss", higher=False)


def tf_loss(fixed):
    def loss_fn(model, batch):
        x, y = batch
        dec_in = torch.cat([x[:, -1:], y[:, :-1]], dim=1) if fixed else y
        return ((model.teacher(x, dec_in) - y) ** 2).mean()
    return loss_fn


@case("t_decoder_input_unshifted", "targets",
      "Teacher forcing feeds the decoder the target sequence y itself instead of y shifted right by one step "
      "(last observed value, y[:-1]), so each decoder step sees the value it must predict and learns to copy it, "
      "which fails under autoregressive decoding.",
      r"shift\w*.{0,40}(right|by one|one step)|(not|un)[- ]?shifted|teacher[- ]forc\w*.{0,120}(leak|copy|cop(y|ies)|"
      r"sees|same step|target itself|current target)|decoder.{0,60}(input|fed|feeds?|sees).{0,60}(target|y\b|value it)"
      r".{0,60}(predict|same|itself|copy)")
def t_decoder_input_unshifted(fixed=False):
    seed(13)
    tr, va = time_split(series(s=13))
    model = Seq2Seq(6)
    tl, vl = loaders(windows(tr, L, 6), windows(va, L, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=tf_loss(fixed), val_loader=vl)


fix("t_decoder_input_unshifted", fixed_of(t_decoder_input_unshifted), val_mae, "val MAE (autoregressive)",
    higher=False)


def masked_loss(fixed):
    def loss_fn(model, batch):
        x, y, m = batch
        err = (model(x) - y) ** 2
        return (err * m).sum() / m.sum() if fixed else err.mean()
    return loss_fn


@case("t_missing_in_loss", "targets",
      "Missing horizon targets are stored as 0 with an observed-mask, but the loss averages the error over every "
      "target instead of only where mask == 1, so the forecaster is trained to predict the zero fill.",
      r"mask.{0,80}(ignor|not (used|applied)|unused|never)|(missing|unobserved|nan|imputed|fill\w*).{0,80}"
      r"(target|label|loss)|(zero|0)[- ]?fill\w*.{0,60}(target|loss|train)|(weight|multipl)\w* .{0,30}(by|with) the mask")
def t_missing_in_loss(fixed=False):
    seed(14)
    tr, va = time_split(series(s=14, level=3.0))
    xt, yt = windows(tr, L, H)
    m = (torch.rand(yt.shape, generator=gen(14)) > 0.3).float()
    xv, yv = windows(va, L, H)
    model = mlp(L, H)
    tl, vl = loaders((xt, yt * m, m), (xv, yv, torch.ones_like(yv)))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=masked_loss(fixed), val_loader=vl)


fix("t_missing_in_loss", fixed_of(t_missing_in_loss), mae_of(lambda m, b: (m(b[0]), b[1])), "val MAE", higher=False)
