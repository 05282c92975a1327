"""Set am, family data: samplers, encodings and windowing between numpy/sklearn habits and the DataLoader."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

from benchmarks.blind_preflight_am.cases_targets import balanced_acc
from benchmarks.blind_preflight_am.registry import case, fix, fixed_of, gen, loader, rmse_of, seed

# ---------------------------------------------------------------------------------------------------------------


def defaults(n: int, s: int, rate: float):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, generator=g)
    score = x @ w / 10 ** 0.5 + 0.5 * torch.sin(2 * x[:, 0]) + 0.4 * torch.randn(n, generator=g)
    y = (score > torch.quantile(score, 1 - rate)).long()
    return x, y


class Logit2(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.net(x)


def margin_logit(model, x):
    out = model(x)
    return out[:, 1] - out[:, 0]


class MarginView(nn.Module):
    """The positive-class margin of a 2-logit model (for the balanced-accuracy metric)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return margin_logit(self.model, x)


def bal_acc_2logit(model, kw):
    return balanced_acc(MarginView(model), kw)


@case("am_sampler_weights_per_class", "data",
      "WeightedRandomSampler is given the per-class weights (a length-2 tensor 1 / class_count) instead of one "
      "weight per sample (class_weights[y]): it draws only dataset indices 0 and 1, so every batch repeats the same "
      "two loan applications.",
      r"((per.class|class|2|two) weights?.{0,80}(instead of|not|rather than).{0,30}(per.sample|each sample|one (weight )?"
      r"per sample|sample weights)|(one|a) weight per (sample|row|example)|weights?\[y\]|class_weights?\[(y|labels?|"
      r"targets?)\]|(only|just) (draws? )?(dataset )?(indices|index|rows?|samples?) 0 and 1|(len|length)\w*.{0,20}(2|"
      r"num_classes|number of classes).{0,60}(sampler|weights))")
def sampler_weights_per_class(fixed: bool = False):
    seed(0)
    x, y = defaults(6000, 41, 0.1)
    xt, yt = x[:5000], y[:5000]
    class_weights = 1.0 / torch.bincount(yt).float()
    weights = class_weights[yt] if fixed else class_weights
    sampler = WeightedRandomSampler(weights, num_samples=len(yt), replacement=True,
                                    generator=torch.Generator().manual_seed(7))
    model = Logit2()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=128, sampler=sampler),
                val_loader=loader(TensorDataset(x[5000:], y[5000:].float()), 500, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=400)


fix("am_sampler_weights_per_class", fixed_of(sampler_weights_per_class), bal_acc_2logit, "val balanced accuracy")

# ---------------------------------------------------------------------------------------------------------------


def store_sales(s: int):
    """Store ids as raw codes (e.g. 1012, 1019, ...); the validation month has no rows for the 8 closed stores."""
    rng = np.random.default_rng(s)
    raw_ids = np.sort(rng.choice(np.arange(1000, 3000), size=60, replace=False))
    effect = rng.normal(0, 1.5, size=60)
    n_train, n_val = 5000, 1000
    st = rng.integers(0, 60, n_train)
    sv = rng.integers(8, 60, n_val)                       # stores 0-7 closed before the validation month
    xt, xv = rng.normal(size=(n_train, 4)), rng.normal(size=(n_val, 4))
    yt = effect[st] + 0.5 * xt[:, 0] + 0.1 * rng.normal(size=n_train)
    yv = effect[sv] + 0.5 * xv[:, 0] + 0.1 * rng.normal(size=n_val)
    return raw_ids[st], xt, yt, raw_ids[sv], xv, yv


class StoreNet(nn.Module):
    def __init__(self, n_stores):
        super().__init__()
        self.store = nn.Embedding(n_stores, 8)
        self.mlp = nn.Sequential(nn.Linear(8 + 4, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.mlp(torch.cat([self.store(x[:, 0].long()), x[:, 1:]], 1)).squeeze(-1)


@case("am_category_codes_refit_val", "data",
      "Store ids are label-encoded with np.unique(ids, return_inverse=True) separately on the training and the "
      "validation frames; the validation month lacks 8 closed stores, so every validation store gets a code shifted "
      "by 8 and is looked up in another store's embedding.",
      r"(np\.unique|return_inverse|(LabelEncoder|cat\.codes|label.encod\w*|categor\w* (codes?|encod\w*)|encod\w*|mapping|"
      r"vocab\w*).{0,60}(refit|re.fit|fit separately|separately|per split|independently|fit (again|on (the )?(val|"
      r"validation|test)))|(fit|refit|re.fit)\w*.{0,40}(on|for) (the )?(val|validation|test)\w*.{0,40}(encod|mapping|"
      r"codes?)|training mapping|codes?.{0,40}shift)")
def category_codes_refit_val(fixed: bool = False):
    seed(0)
    st, xt, yt, sv, xv, yv = store_sales(42)
    train_ids, ct = np.unique(st, return_inverse=True)
    cv = np.searchsorted(train_ids, sv) if fixed else np.unique(sv, return_inverse=True)[1]
    def frame(codes, x):
        return torch.tensor(np.concatenate([codes[:, None], x], 1), dtype=torch.float32)
    model = StoreNet(len(train_ids))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(frame(ct, xt), torch.tensor(yt, dtype=torch.float32)), 64),
                val_loader=loader(TensorDataset(frame(cv, xv), torch.tensor(yv, dtype=torch.float32)), 500,
                                  shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_category_codes_refit_val", fixed_of(category_codes_refit_val), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False, steps=400)

# ---------------------------------------------------------------------------------------------------------------


def sensor_series(n: int, s: int):
    g = gen(s)
    t = torch.arange(n).float()
    z = torch.sin(0.3 * t) + 0.5 * torch.sin(0.05 * t + 1.0) + 0.1 * torch.randn(n, generator=g)
    return z


def make_windows(z, length: int):
    idx = range(len(z) - length)
    return torch.stack([z[i:i + length] for i in idx]), torch.stack([z[i + length] for i in idx])


@case("am_shuffle_before_windowing", "data",
      "The sensor series is shuffled row-wise (z[np.random.permutation(len(z))], 'shuffle the training data') before "
      "the sliding windows are cut, so each window is a bag of random time points and its target an unrelated "
      "random point; the temporal order the forecaster needs is destroyed.",
      r"(shuffl|permut)\w*.{0,120}(before|prior to).{0,40}(window|sequence|lag)|(window|sequence)\w*.{0,80}"
      r"(after|from) (a |the )?(shuffl|permut)|(temporal|time) (order|structure).{0,60}(destroy|lost|broken|"
      r"shuffl)|(shuffl|permut)\w*.{0,60}(time series|series|rows).{0,60}(order|temporal)")
def shuffle_before_windowing(fixed: bool = False):
    seed(0)
    z = sensor_series(3000, 43)
    train, val = z[:2500], z[2500:]
    if not fixed:
        train = train[torch.tensor(np.random.default_rng(0).permutation(len(train)))]
    x, y = make_windows(train, 20)
    xv, yv = make_windows(val, 20)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64),
                val_loader=loader(TensorDataset(xv, yv), 500, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_shuffle_before_windowing", fixed_of(shuffle_before_windowing), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)

# ---------------------------------------------------------------------------------------------------------------


def merchant_data(s: int):
    rng = np.random.default_rng(s)
    n_merchants, n_train, n_val = 2000, 4000, 1500
    effect = rng.normal(0, 1.0, n_merchants)
    mt, mv = rng.integers(0, n_merchants, n_train), rng.integers(0, n_merchants, n_val)
    xt, xv = rng.normal(size=(n_train, 5)), rng.normal(size=(n_val, 5))
    def target(m, x):
        return effect[m] + np.tanh(x[:, 0]) + 0.5 * x[:, 1] + rng.normal(0, 1.5, len(m))
    return mt, xt, target(mt, xt), mv, xv, target(mv, xv)


def mean_encoding(keys, values, n):
    sums, counts = np.bincount(keys, values, n), np.bincount(keys, None, n)
    return sums, counts


@case("am_target_encoding_own_row", "data",
      "The merchant id is target-encoded with the mean amount of the merchant over the whole training frame, the "
      "row's own target included (about 2 rows per merchant): in training the feature leaks half of each label, so "
      "the model leans on it, and at validation time, where the encoding holds no own label, that reliance misfires.",
      r"(target.?encod\w*|mean.?encod\w*|own (label|target)|label leak\w*|target leak\w*|leak\w*.{0,60}(label|target)|"
      r"(out.of.fold|k.?fold|leave.one.out).{0,60}(encod|mean))")
def target_encoding_own_row(fixed: bool = False):
    seed(0)
    mt, xt, yt, mv, xv, yv = merchant_data(44)
    n = 2000
    prior = yt.mean()

    def encode(s_, c_):                                   # groupby('merchant').mean(), the global mean if unseen
        return np.where(c_ > 0, s_ / np.maximum(c_, 1), prior)
    sums, counts = mean_encoding(mt, yt, n)
    if fixed:                                             # out-of-fold: 5 folds, each row encoded by the others
        enc_t = np.zeros(len(mt))
        folds = np.arange(len(mt)) % 5
        for f in range(5):
            s_in, c_in = mean_encoding(mt[folds != f], yt[folds != f], n)
            enc_t[folds == f] = encode(s_in, c_in)[mt[folds == f]]
    else:
        enc_t = encode(sums, counts)[mt]
    enc_v = encode(sums, counts)[mv]
    def frame(enc, x):
        return torch.tensor(np.concatenate([enc[:, None], x], 1), dtype=torch.float32)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(frame(enc_t, xt), torch.tensor(yt, dtype=torch.float32)), 64),
                val_loader=loader(TensorDataset(frame(enc_v, xv), torch.tensor(yv, dtype=torch.float32)), 500,
                                  shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=600)


fix("am_target_encoding_own_row", fixed_of(target_encoding_own_row), rmse_of(lambda m, b: (m(b[0]), b[1])),
    "val RMSE", higher=False)

# ---------------------------------------------------------------------------------------------------------------


@case("am_sampler_plus_class_weights", "data",
      "The 3%-positive churn data is rebalanced twice: a WeightedRandomSampler already draws the classes 50/50 and "
      "CrossEntropyLoss(weight=1 / class_count) re-weights them again, so positives count about 30x more than "
      "negatives and the model flags far too many customers.",
      r"((twice|double|both).{0,120}(sampler|resampl|oversampl|class.weight|weight=)|(sampler|resampl\w*|oversampl\w*)"
      r".{0,160}(and|plus|as well as|together with|on top of) (the )?(class.weights? (in|of) (the )?(loss|CrossEntropyLoss)|"
      r"(CrossEntropyLoss|loss)\s*\(\s*weight|weighted (loss|CrossEntropyLoss))|(class.)?weight\w* (in|of) (the )?(loss|"
      r"CrossEntropyLoss).{0,120}(on top of|as well as|in addition to|together with|plus|and).{0,40}(sampler|resampl|"
      r"oversampl)|over.?correct\w*|(re)?balanc\w* (twice|two times))")
def sampler_plus_class_weights(fixed: bool = False):
    seed(0)
    x, y = defaults(8000, 45, 0.03)
    xt, yt = x[:6000], y[:6000]
    counts = torch.bincount(yt).float()
    sampler = WeightedRandomSampler((1.0 / counts)[yt], num_samples=len(yt), replacement=True,
                                    generator=torch.Generator().manual_seed(8))
    loss_fn = nn.CrossEntropyLoss() if fixed else nn.CrossEntropyLoss(weight=counts.sum() / (2 * counts))
    model = Logit2()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=DataLoader(TensorDataset(xt, yt), batch_size=128, sampler=sampler),
                val_loader=loader(TensorDataset(x[6000:], y[6000:].float()), 500, shuffle=False),
                loss_fn=loss_fn, max_steps=400)


def precision_at_0(model, kw):
    tp = fp = 0.0
    was = model.training
    model.eval()
    with torch.no_grad():
        for x, y in kw["val_loader"]:
            p = (margin_logit(model, x) > 0).float()
            tp += (p * y).sum().item()
            fp += (p * (1 - y)).sum().item()
    model.train(was)
    return tp / max(tp + fp, 1.0)


fix("am_sampler_plus_class_weights", fixed_of(sampler_plus_class_weights), precision_at_0,
    "val precision of the flagged customers")
