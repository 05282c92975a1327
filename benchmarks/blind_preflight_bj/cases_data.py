"""Family ``data``: how rows, windows, covariates, fills and batches reach the model."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from benchmarks.blind_preflight_bj.cases_trained import ae_loaders, ae_loss, anomaly_windows
from benchmarks.blind_preflight_bj.models import WindowAE
from benchmarks.blind_preflight_bj.registry import (case, fix, fixed_of, gen, loader, loaders, mae_of, mlp,
                                                    recon_auroc, seed, series, time_split, val_mae, windows)

L, H = 24, 3


@case("d_lags_after_shuffle", "data",
      "The rows of the long series are shuffled (torch.randperm over time) before the lag windows and targets are "
      "built, so each window's lags and its target come from unrelated time steps instead of consecutive ones.",
      r"(shuffl|permut|randperm)\w*.{0,80}(before|prior to|then).{0,80}(lag|window|target)|"
      r"(lag|window)s?.{0,80}(after|from).{0,40}(shuffl|permut)|(temporal|time) order.{0,60}(destroy|lost|broken|"
      r"scrambl)|(consecutive|contiguous|adjacent).{0,60}(not|no longer|unrelated)")
def d_lags_after_shuffle(fixed=False):
    seed(40)
    x = series(S=1, T=2400, s=40)[0]
    tr, va = x[:1800], x[1800:]
    order = torch.arange(len(tr)) if fixed else torch.randperm(len(tr), generator=gen(40))
    tr = tr[order]
    model = mlp(L, H)
    tl, vl = loaders(windows(tr[None], L, H), windows(va[None], L, H))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("d_lags_after_shuffle", fixed_of(d_lags_after_shuffle), val_mae, "val MAE", higher=False)


def ffill(x):
    """Forward-fill NaNs along time (first value: the row's first observed value)."""
    out = x.clone()
    first = torch.nan_to_num(x, nan=0.0)[:, :1]
    out[:, 0] = torch.where(torch.isnan(x[:, 0]), first[:, 0], x[:, 0])
    for t in range(1, x.shape[1]):
        out[:, t] = torch.where(torch.isnan(x[:, t]), out[:, t - 1], x[:, t])
    return out


@case("d_missing_zero_no_mask", "data",
      "Missing input observations (NaN, about 40%) are filled with 0 in raw units, far below the series level, "
      "instead of being forward-filled (or masked), so the model sees spurious drops to zero in its lag windows.",
      r"(fill|impute|replace)\w*.{0,60}(0|zero)|(zero|0)[- ]fill|nan_to_num|forward[- ]fill|ffill|"
      r"(missing|nan).{0,80}(zero|0\b|impute|fill|mask)")
def d_missing_zero_no_mask(fixed=False):
    seed(41)
    x = series(S=8, s=41, level=4.0)
    miss = torch.rand(x.shape, generator=gen(41)) < 0.4
    raw = x.masked_fill(miss, float("nan"))
    filled = ffill(raw) if fixed else torch.nan_to_num(raw, nan=0.0)
    (ftr, fva), (xtr, xva) = time_split(filled), time_split(x)
    (xt, _), (_, yt) = windows(ftr, L, H), windows(xtr, L, H)
    (xv, _), (_, yv) = windows(fva, L, H), windows(xva, L, H)
    model = mlp(L, H)
    tl, vl = loaders((xt, yt), (xv, yv))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


fix("d_missing_zero_no_mask", fixed_of(d_missing_zero_no_mask), val_mae, "val MAE", higher=False)


@case("d_ae_contaminated", "data",
      "The reconstruction autoencoder is trained on all windows, including the 30% labelled as anomalous, instead of "
      "the normal windows only (x[labels == 0]), so it learns to reconstruct the anomaly pattern.",
      r"(train\w*|fit\w*).{0,80}(includ|contain|with|on).{0,40}(anomal|abnormal|outlier|contaminat)|"
      r"(anomal|abnormal|outlier)\w*.{0,80}(in|into|part of) the train|contaminat|(normal|clean)[- ](windows|data|"
      r"samples) only|labels? ?== ?0")
def d_ae_contaminated(fixed=False):
    seed(42)
    tr, tr_lab, va, lab = anomaly_windows(42, contaminate=0.3)
    if fixed:
        tr = tr[~tr_lab]
    model = WindowAE(32)
    tl, vl = ae_loaders(tr, va, lab)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=ae_loss, val_loader=vl)


fix("d_ae_contaminated", fixed_of(d_ae_contaminated), recon_auroc, "anomaly AUROC")



@case("d_covariate_misaligned", "data",
      "The known-future promotion covariates are sliced from promo[t+L-1 : t+L-1+H] instead of promo[t+L : t+L+H], so "
      "each horizon step is paired with the previous step's promotion flag.",
      r"(covariate|promo\w*|exogenous|calendar|feature)s?.{0,80}(misalign|shift|off[- ]by[- ]one|lag|one step|"
      r"previous step|wrong (time|step))|off[- ]by[- ]one|(align|index)\w*.{0,60}(horizon|forecast) (step|time)")
def d_covariate_misaligned(fixed=False):
    seed(43)
    base = series(s=43)
    promo = (torch.rand(base.shape, generator=gen(43)) < 0.3).float()
    x = base + 2.0 * promo
    shift = 0 if fixed else 1
    (tr, va), (ptr, pva) = time_split(x), time_split(promo)
    tr_w, va_w = _promo(tr, ptr, shift), _promo(va, pva, shift)
    model = mlp(L + H, H)
    tl, vl = loaders(tr_w, va_w)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 2e-3), train_loader=tl,
                loss_fn=nn.MSELoss(), val_loader=vl)


def _promo(x, promo, shift):
    """Window (lags, covariates of the horizon steps shifted back by ``shift``), targets."""
    w = x[:, 1:].unfold(1, L + H, 1).reshape(-1, L + H)
    p = promo.unfold(1, L + H + 1, 1).reshape(-1, L + H + 1)  # p[:, j] is promo at window start - 1 + j
    cov = p[:, 1 + L - shift:1 + L + H - shift]
    return torch.cat([w[:, :L], cov], 1), w[:, L:].contiguous()


fix("d_covariate_misaligned", fixed_of(d_covariate_misaligned), val_mae, "val MAE", higher=False)


class SortedGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(1, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x, lengths):
        _, h = self.gru(pack_padded_sequence(x.unsqueeze(-1), lengths, batch_first=True))
        return self.head(h[-1]).squeeze(-1)


def sorting_collate(fixed):
    def collate(items):
        xs, lens, ys = zip(*items)
        lens = torch.stack(lens)
        order = lens.argsort(descending=True)
        x, y = torch.stack(xs)[order], torch.stack(ys)
        return x, lens[order], (y[order] if fixed else y)
    return collate


def seq_loss(model, batch):
    x, lens, y = batch
    return ((model(x, lens) - y) ** 2).mean()


@case("d_collate_sort_unpaired", "data",
      "The collate_fn sorts the padded series by length (descending, for pack_padded_sequence) but leaves the targets "
      "in the original order, so after sorting the targets no longer belong to their series.",
      r"(sort|reorder|permut)\w*.{0,100}(target|label|y\b).{0,60}(not|never|without|original|unsorted|same order)|"
      r"(target|label)s?.{0,80}(not|never) (sorted|reordered|permuted)|(target|label)s?.{0,60}(misalign|mismatch|"
      r"out of order|no longer (match|belong|correspond))|(same|sorted) (order|permutation|index)")
def d_collate_sort_unpaired(fixed=False):
    from benchmarks.blind_preflight_bj.cases_mechanics import var_length
    seed(44)
    tr, va = var_length(44, 1500), var_length(45, 400)
    model = SortedGRU()
    tl, vl = loaders(tr, va, collate_fn=sorting_collate(fixed))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3), train_loader=tl,
                loss_fn=seq_loss, val_loader=vl)


def sorted_metric(model, kw):
    # scored with a correct collate on the same validation windows (the user's collate would hide the damage)
    return mae_of(lambda m, b: (m(b[0], b[1]), b[2]))(model, dict(val_loader=_val_correct))


from benchmarks.blind_preflight_bj.cases_mechanics import var_length as _vl  # noqa: E402

_val_correct = loaders(_vl(44, 10), _vl(45, 400), collate_fn=sorting_collate(True))[1]

fix("d_collate_sort_unpaired", fixed_of(d_collate_sort_unpaired), sorted_metric, "val MAE", higher=False)
