"""Targets: labels or regression targets that do not say what the user thinks they say."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from .registry import acc_of, balanced_acc_of, case, first_arg, fix, fixed_of, gen, loader, mean_over, seed

# --- T1: binary masks saved as 0/255 with the VOC-style ignore_index=255 ---------------------------------------------

def _cells(n, s):
    """16x16 grey microscopy-like crops; the mask (as read from a PNG: 0 background, 255 cell) marks a bright disc."""
    g = gen(s)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    cy = torch.randint(4, 12, (n,), generator=g).float()
    cx = torch.randint(4, 12, (n,), generator=g).float()
    r = 2.0 + 2.0 * torch.rand(n, generator=g)
    disc = ((yy - cy[:, None, None]) ** 2 + (xx - cx[:, None, None]) ** 2) <= r[:, None, None] ** 2
    img = 0.3 * torch.randn(n, 1, 16, 16, generator=g) + 0.8 * disc[:, None].float()
    png = disc.to(torch.uint8) * 255
    return img, png


class TinyFCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(16, 2, 1))

    def forward(self, x):
        return self.net(x)


@case("targets_binary_mask_255_ignored", "targets",
      bug="the binary masks are read from PNGs as 0 (background) / 255 (cell) and used as class ids with "
          "CrossEntropyLoss(ignore_index=255) copied from a VOC recipe: every foreground pixel is ignored, so the "
          "model only ever sees background targets and predicts background everywhere; the masks need mask // 255",
      cause_pattern=r"ignore_index\W{0,6}255[^.]{0,120}(foreground|positive|cell|class 1|all|every|only)|"
                    r"255[^.]{0,60}(ignored|never (trained|seen|scored)|excluded)|(mask|label)s? (are|hold|contain\w*) 0 ?(and|/|or) ?255|"
                    r"(//|divide\w* by|/) ?255[^.]{0,40}(mask|label|target)|only (the )?background (class|label|target)")
def targets_binary_mask_255_ignored(fixed=False):
    seed(0)
    x, m = _cells(1024, 1)
    xv, mv = _cells(256, 2)
    y = (m // 255).long() if fixed else m.long()
    yv = (mv // 255).long()
    model = TinyFCN()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(xv, yv), 64, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(ignore_index=255), max_steps=300)


def _pix_pred(m, b):
    return m(b[0]).argmax(1).reshape(-1), b[1].reshape(-1)


fix("targets_binary_mask_255_ignored", fixed_of(targets_binary_mask_255_ignored), balanced_acc_of(_pix_pred, 2),
    "val mean per-class pixel recall")


# --- T2: forecasting windows whose target is the last input value, not the next one ---------------------------------

WINDOW = 12


def _load_series(n_series, length, s):
    g = gen(s)
    t = torch.arange(length).float()
    period = 4.0 + 3.0 * torch.rand(n_series, 1, generator=g)
    phase = 6.28 * torch.rand(n_series, 1, generator=g)
    amp = 1.0 + torch.rand(n_series, 1, generator=g)
    return amp * torch.sin(6.2832 * t / period + phase) + 0.05 * torch.randn(n_series, length, generator=g)


class LoadWindows(Dataset):
    def __init__(self, series, horizon_shift):
        self.series, self.shift = series, horizon_shift
        self.per = series.shape[1] - WINDOW - 1

    def __len__(self):
        return self.series.shape[0] * self.per

    def __getitem__(self, i):
        row, start = divmod(i, self.per)
        x = self.series[row, start:start + WINDOW]
        y = self.series[row, start + WINDOW - 1 + self.shift]   # shift 1: the next value
        return x.unsqueeze(-1), y


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(1, 32, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h[:, -1]).squeeze(-1)


def _true_next_windows(kw):
    return loader(LoadWindows(_load_series(16, 60, 4), 1), 256, shuffle=False)


@case("targets_forecast_target_is_last_input", "targets",
      bug="the forecasting Dataset returns series[start + window - 1] as the target, which is the last value of the "
          "input window itself, instead of series[start + window] (the next step): the LSTM learns to copy its last "
          "input (persistence) and never forecasts",
      cause_pattern=r"off[- ]by[- ]one|(target|label)s?[^.]{0,60}(last|final) (input|value|element|step) of the (input|window)|"
                    r"(copy|copies|copying|repeat\w*) (the|its) (last|final) input|persistence|"
                    r"(target|label)s? (is|are|equals?) (already )?(in|part of|contained in) the input|"
                    r"\+ ?window\b|start ?\+ ?window")
def targets_forecast_target_is_last_input(fixed=False):
    seed(0)
    train = LoadWindows(_load_series(64, 60, 3), 1 if fixed else 0)
    val = LoadWindows(_load_series(16, 60, 4), 1 if fixed else 0)
    model = Forecaster()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 64), val_loader=loader(val, 256, shuffle=False), loss_fn=nn.MSELoss(),
                max_steps=300)


def _next_rmse(model, kw):
    def fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).sum().item(), b[1].numel()
    return math.sqrt(mean_over(model, _true_next_windows(kw), fn))


fix("targets_forecast_target_is_last_input", fixed_of(targets_forecast_target_is_last_input), _next_rmse,
    "RMSE of the next-step forecast", higher=False)


# --- T3: multi-label tags trained with CrossEntropyLoss on multi-hot targets -----------------------------------------

TAGS = 8


def _tagged(n, s):
    g = gen(s)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, TAGS, generator=gen(31))
    return x, (x @ w > 0.8).float()            # several tags per row, often none


@case("targets_multilabel_with_cross_entropy", "targets",
      bug="the targets are multi-hot tag vectors (several or no tags per row) but the loss is nn.CrossEntropyLoss, a "
          "softmax over tags that makes them compete for one unit of probability; sigmoid(logit) > 0.5 at inference "
          "then means nothing; multi-label needs BCEWithLogitsLoss",
      cause_pattern=r"multi[- ]?label|multi[- ]?hot|CrossEntropyLoss[^.]{0,80}(BCEWithLogits|sigmoid|independent)|"
                    r"(labels|tags|classes) (are not|aren't) mutually exclusive|more than one (positive|1|label|class) per (row|sample)|"
                    r"(rows?|samples?) with (several|multiple|no) (labels|tags|positives)|softmax[^.]{0,40}(compete|sum to (1|one))[^.]{0,60}(tags|labels)")
def targets_multilabel_with_cross_entropy(fixed=False):
    seed(0)
    x, y = _tagged(2048, 5)
    xv, yv = _tagged(512, 6)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, TAGS))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=300)


def _tag_pred(m, b):
    return (torch.sigmoid(m(b[0])) > 0.5).float(), b[1]


fix("targets_multilabel_with_cross_entropy", fixed_of(targets_multilabel_with_cross_entropy), acc_of(_tag_pred),
    "val per-tag accuracy")


# --- T4: class weights set to the class counts instead of their inverse ----------------------------------------------

def _triage(n, s, balanced=False):
    g = gen(s)
    probs = torch.tensor([1 / 3, 1 / 3, 1 / 3]) if balanced else torch.tensor([0.85, 0.11, 0.04])
    y = torch.multinomial(probs, n, replacement=True, generator=g)
    centers = torch.tensor([[0.0, 0.0], [1.4, 0.6], [0.3, 1.5]])
    x = centers[y] + 0.6 * torch.randn(n, 2, generator=g)
    x = torch.cat([x, 0.5 * torch.randn(n, 6, generator=g)], 1)
    return x, y


@case("targets_class_weights_are_counts", "targets",
      bug="the CrossEntropyLoss weight= tensor is the class counts (normalised) instead of their inverse: the "
          "85% majority class gets the largest weight and the 4% class the smallest, so the rare classes are "
          "suppressed even further than without weights",
      cause_pattern=r"weight\w*[^.]{0,80}(proportional to|equal to|are|is|=) (the )?(class )?(counts|frequenc\w+)|"
                    r"inverse (class )?frequenc\w*|1 ?/ ?(count|freq|frequency|n_?c|class_count)|"
                    r"(majority|most frequent|largest) class[^.]{0,40}(largest|highest|biggest) weight|"
                    r"(rare|minority) class\w*[^.]{0,40}(smallest|lowest) weight")
def targets_class_weights_are_counts(fixed=False):
    seed(0)
    x, y = _triage(3000, 7)
    xv, yv = _triage(900, 8, balanced=True)
    counts = torch.bincount(y, minlength=3).float()
    weight = (1.0 / counts) if fixed else counts
    weight = weight / weight.sum() * 3
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 300, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weight), max_steps=300)


fix("targets_class_weights_are_counts", fixed_of(targets_class_weights_are_counts), balanced_acc_of(first_arg, 3),
    "val balanced accuracy")


# --- T5: house prices regressed in raw dollars ------------------------------------------------------------------------

def _houses(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=gen(41))
    price = 250_000 + 60_000 * torch.tanh(x @ w / 3) + 5_000 * torch.randn(n, generator=g)
    return x, price


class PriceNet(nn.Module):
    def __init__(self, y_mean=0.0, y_std=1.0):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 1))
        self.register_buffer("y_mean", torch.tensor(float(y_mean)))
        self.register_buffer("y_std", torch.tensor(float(y_std)))

    def forward(self, x):
        return self.body(x).squeeze(-1) * self.y_std + self.y_mean


def _scaled_mse(model, batch):
    x, y = batch
    return F.mse_loss((model(x) - model.y_mean) / model.y_std, (y - model.y_mean) / model.y_std)


@case("targets_regression_target_in_raw_dollars", "targets",
      bug="the regression target is the raw sale price (about 250,000 +- 60,000) with MSELoss and Adam at lr 1e-3: "
          "a freshly initialised head outputs values near 0 and Adam moves each weight about lr per step, so the "
          "predictions crawl towards 1e5 and the loss stays in the 1e10 range; the target needs standardising "
          "(y - mean) / std (and predictions un-scaled)",
      cause_pattern=r"(target|label|price)s?[^.]{0,80}(\b\d{2,3},\d{3}\b|1e\+?0?5|2\.5e\+?0?5|hundreds? of thousands)|"
                    r"\(y ?- ?(y_)?mean\) ?/ ?(y_)?std|(un-?scal|inverse[- ]transform|de-?normali[sz]|de-?standardi[sz])\w*[^.]{0,30}prediction|"
                    r"loss[^.]{0,40}1e\+?(9|1\d)|(output|prediction)s?[^.]{0,40}(near|around|close to) 0[^.]{0,80}(target|price)")
def targets_regression_target_in_raw_dollars(fixed=False):
    seed(0)
    x, y = _houses(2048, 9)
    xv, yv = _houses(512, 10)
    model = PriceNet(y.mean(), y.std()) if fixed else PriceNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(xv, yv), 256, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


def _price_rmse(model, kw):
    def fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).sum().item(), b[1].numel()
    return math.sqrt(mean_over(model, kw["val_loader"], fn))


fix("targets_regression_target_in_raw_dollars", fixed_of(targets_regression_target_in_raw_dollars), _price_rmse,
    "val RMSE in dollars", higher=False)
