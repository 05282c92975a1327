"""Set r, family targets: what the loss is asked to match is not what the user means."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_r.registry import case, eval_acc, eval_rmse, fix, fixed_of, gen, loader, mean_over, seed

# --- 1. web-traffic forecasting: the "next value" target is the last value of the input window -------------------


def traffic_series(n, s):
    g = np.random.default_rng(s)
    t = np.arange(n)
    return (np.sin(2 * np.pi * t / 11) + 0.6 * np.sin(2 * np.pi * t / 5.3 + 1) + 0.05 * g.standard_normal(n)).astype(np.float32)


def make_windows(series, window, fixed):
    xs, ys = [], []
    for i in range(len(series) - window - 1):
        xs.append(series[i:i + window])
        ys.append(series[i + window] if fixed else series[i + window - 1])   # "y = the value at the end of the window"
    return torch.tensor(np.array(xs)), torch.tensor(np.array(ys))[:, None]


_VAL_SERIES = traffic_series(600, 12)
_TRUE_VAL = make_windows(_VAL_SERIES, 24, True)   # what the forecast is for: the value after the window


def traffic(fixed=False):
    seed(0)
    x, y = make_windows(traffic_series(2000, 11), 24, fixed)
    vx, vy = make_windows(_VAL_SERIES, 24, fixed)
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=300)


case("traffic_forecast_target_not_shifted", "targets",
     "The forecasting target is series[i + window - 1], the last value already inside the input window, instead of "
     "series[i + window], so the model learns to echo its last input rather than predict the next step.",
     r"(target|label|y)\w*.{0,80}(last|final) (value|element|step|time ?step).{0,40}(input|window)|(not|isn't|is not) "
     r"shifted|shift\w* (the )?(target|label)s?.{0,40}(by )?one|off[- ]by[- ]one|i ?\+ ?window ?- ?1|"
     r"(copy|copies|echo\w*|repeat\w*) (of )?(its|the) (last|latest|current) input|already (inside|in|part of) the (input|window)")(traffic)
fix("traffic_forecast_target_not_shifted", fixed_of(traffic),
    lambda m, kw: eval_rmse(m, loader(TensorDataset(*_TRUE_VAL), 200, shuffle=False), lambda mm, b: (mm(b[0]), b[1])),
    "one-step-ahead RMSE on the true next values", higher=False)

# --- 2. fashion-like images: NLLLoss on raw logits (no log_softmax) --------------------------------------------


def garments(n, s):
    g = gen(s)
    protos = torch.randn(5, 64, generator=gen(99))
    y = torch.randint(0, 5, (n,), generator=g)
    return protos[y] + 1.2 * torch.randn(n, 64, generator=g), y


class GarmentNet(nn.Module):
    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 5))

    def forward(self, x):
        out = self.net(x)
        return F.log_softmax(out, dim=1) if self.fixed else out


def garment(fixed=False):
    seed(0)
    x, y = garments(1500, 13)
    vx, vy = garments(500, 14)
    model = GarmentNet(fixed)
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.NLLLoss(), max_steps=300)


case("garment_nllloss_on_raw_logits", "targets",
     "nn.NLLLoss is applied to the raw linear outputs without log_softmax, so the 'loss' is just minus the true-class "
     "logit: it is unbounded below, goes negative, and never pushes the other classes down.",
     r"(nll_?loss|negative log[- ]likelihood).{0,120}(log_?softmax|log[- ]probabilit|raw (logits|outputs|scores)|crossentropy)|"
     r"(log_?softmax).{0,80}(missing|without|forgot|not applied|before nll)|(raw|unnormali[sz]ed) (logits|outputs|scores).{0,60}"
     r"(nll|negative log)|unbounded below")(garment)
fix("garment_nllloss_on_raw_logits", fixed_of(garment),
    lambda m, kw: eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1])), "val accuracy")

# --- 3. skin-lesion masks read from PNG as 0/255 fed to BCEWithLogitsLoss ----------------------------------------


def lesions(n, s, scale):
    g = gen(s)
    x = torch.randn(n, 1, 16, 16, generator=g) * 0.5
    yy, xx = torch.meshgrid(torch.arange(16.), torch.arange(16.), indexing="ij")
    cy, cx = torch.randint(3, 13, (n, 1, 1), generator=g).float(), torch.randint(3, 13, (n, 1, 1), generator=g).float()
    mask = (((yy - cy) ** 2 + (xx - cx) ** 2) < 5).float()[:, None]
    x = x + 1.2 * mask
    return x, mask * scale


class LesionNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))

    def forward(self, x):
        return self.net(x)


def lesion(fixed=False):
    seed(0)
    x, m = lesions(600, 15, 1.0 if fixed else 255.0)     # PIL mask as np.array: {0, 255}
    vx, vm = lesions(200, 16, 1.0 if fixed else 255.0)
    model = LesionNet()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, m), 16), val_loader=loader(TensorDataset(vx, vm), 50, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


def iou(model, kw):
    def fn(mm, b):
        p = mm(b[0]) > 0
        t = b[1] > 0
        return (p & t).sum().item(), (p | t).sum().item()
    return mean_over(model, kw["val_loader"], fn)


case("lesion_mask_0_255_bce", "targets",
     "The binary masks are loaded as 0/255 and passed unscaled to BCEWithLogitsLoss, whose targets must lie in [0, 1]; "
     "with target 255 the loss is unbounded below (it goes negative) and drives every foreground-looking pixel up.",
     r"255|(targets?|masks?|labels?) (values? )?(are |must be |should be )?(outside|not in|out of) \[?0, ?1\]?|(divide|scale|"
     r"normali[sz]e) (the )?(masks?|targets?|labels?)|(masks?|targets?) (to|into) \{?0, ?1\}?")(lesion)
fix("lesion_mask_0_255_bce", fixed_of(lesion), iou, "val IoU")

# --- 4. movie-genre tagging: multi-hot targets with CrossEntropyLoss ---------------------------------------------


def movies(n, s):
    g = gen(s)
    x = torch.randn(n, 40, generator=g)
    w = torch.randn(40, 6, generator=gen(77))
    y = ((x @ w) > 2.0).float()
    return x, y


def movie(fixed=False):
    seed(0)
    x, y = movies(1500, 17)
    vx, vy = movies(500, 18)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(vx, vy), 100, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=300)


def label_f1(model, kw):
    def fn(mm, b):
        p = torch.sigmoid(mm(b[0])) > 0.5
        t = b[1] > 0.5
        return 2 * (p & t).sum().item(), p.sum().item() + t.sum().item()
    return mean_over(model, kw["val_loader"], fn)


case("genre_multilabel_crossentropy", "targets",
     "Multi-label genre targets (multi-hot, several 1s per row) are trained with nn.CrossEntropyLoss, which treats "
     "them as one softmax distribution over mutually exclusive classes, while predictions are read as independent "
     "sigmoids; BCEWithLogitsLoss is the loss for multi-label.",
     r"multi[- ]?label.{0,120}(crossentropy|cross[- ]entropy|softmax|bce|binary)|(crossentropy|cross[- ]entropy|softmax).{0,120}"
     r"multi[- ]?(label|hot)|multi[- ]?hot|(several|multiple|more than one) (positive )?(labels?|classes|1s|ones) per (row|sample|example)|"
     r"mutually exclusive")(movie)
fix("genre_multilabel_crossentropy", fixed_of(movie), label_f1, "val micro-F1 (sigmoid > 0.5)")

# --- 5. bird species: LabelEncoder refit on the validation split -------------------------------------------------

SPECIES = np.array(["blackbird", "crow", "finch", "robin", "sparrow", "wren"])


def birds(n, s, drop=None):
    g = gen(s)
    y = torch.randint(0, 6, (n,), generator=g)
    if drop is not None:
        y = y[y != drop]
    protos = torch.randn(6, 12, generator=gen(55)) * 1.5
    x = protos[y] + torch.randn(len(y), 12, generator=g)
    return x, SPECIES[y.numpy()]


def encode(names):
    classes = np.unique(names)                       # LabelEncoder().fit_transform(names)
    return torch.tensor(np.searchsorted(classes, names))


_VX, _VNAMES = birds(500, 20, drop=1)                 # no crow was recorded in the validation season
_TRUE_VY = torch.tensor(np.searchsorted(SPECIES, _VNAMES))


def bird(fixed=False):
    seed(0)
    x, names = birds(1500, 19)
    y = encode(names)
    vy = torch.tensor(np.searchsorted(np.unique(names), _VNAMES)) if fixed else encode(_VNAMES)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 6))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 32), val_loader=loader(TensorDataset(_VX, vy), 100, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=300)


case("birds_labelencoder_refit_on_val", "targets",
     "The species names are label-encoded separately for train and validation (LabelEncoder().fit_transform on each "
     "split); validation lacks one species, so every species after it gets a different integer than in training.",
     r"label ?encoder.{0,120}(separately|each split|refit|re-fit|fit_transform|again|both)|(fit|encod)\w* (separately|"
     r"independently) (on|for) (train|each|the validation)|(different|inconsistent|mismatched|shifted) (label|class|integer) "
     r"(mapping|encoding|ids?|indices)|(class|label) (ids?|indices|mapping) (differ|shifted|do not match|don't match)")(bird)
fix("birds_labelencoder_refit_on_val", fixed_of(bird),
    lambda m, kw: eval_acc(m, kw["val_loader"], lambda mm, b: (mm(b[0]).argmax(-1), b[1])),
    "val accuracy against the val labels the user encoded")
