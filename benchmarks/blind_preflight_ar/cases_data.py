"""Set ar, family data: the Dataset / collate / preprocessing feeds the model something other than intended."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from benchmarks.blind_preflight_ar.registry import (
    TAU,
    accuracy,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    log_mel,
    mean_over,
    own_val,
    rmse_on,
    seed,
    sine_series,
    val_acc,
)


def _sed_clips(n, s, F_=16, T=48, n_classes=3):
    """Sound-event clips: log-mel features (n, F_, T) at a 20 ms hop and the annotators' frame labels (n, 2T) at a
    10 ms hop (0 = background, 1..2 = event types)."""
    g = gen(s)
    x = 0.6 * torch.randn(n, F_, T, generator=g)
    fine = torch.zeros(n, 2 * T, dtype=torch.long)
    for i in range(n):
        for _ in range(2):
            c = int(torch.randint(1, n_classes, (1,), generator=g))
            start = int(torch.randint(0, T - 8, (1,), generator=g))
            dur = int(torch.randint(4, 9, (1,), generator=g))
            band = slice(2, 6) if c == 1 else slice(9, 13)
            x[i, band, start:start + dur] += 1.5
            fine[i, 2 * start:2 * (start + dur)] = c
    return x, fine


@case("sed_labels_at_other_hop", "data",
      bug="Frame labels annotated at a 10 ms hop are cut to the first T entries (labels[:, :T]) to match the T "
          "feature frames computed at a 20 ms hop, instead of being resampled (labels[:, ::2]), so every frame gets "
          "the label of a point at half its time.",
      cause_pattern=r"\bhop\b|frame rate|(frame|label|annotation)s?.{0,60}(misaligned|not aligned|out of (sync|step)|"
                    r"different (rate|resolution|hop))|(resolution|rate).{0,60}(label|annotation)s?.{0,40}(differ|"
                    r"match)|truncat\w*.{0,60}label|label\w*.{0,60}truncat|(downsampl|resampl)\w*.{0,40}(label|"
                    r"annotation|target)|(label|annotation|target)s?.{0,40}(downsampl|resampl)|\[\s*:\s*,\s*::\s*2"
                    r"\s*\]")
def sed_labels_at_other_hop(fixed: bool = False):
    seed(0)
    x, fine = _sed_clips(900, s=31)
    T = x.shape[-1]
    y = fine[:, ::2] if fixed else fine[:, :T]          # "make the label length match the number of frames"
    model = nn.Sequential(nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(),
                          nn.Conv1d(32, 3, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:750], y[:750]), 32), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[750:], y[750:]), 150, shuffle=False), max_steps=300)


def _event_frame_acc(model, kw):
    return accuracy(model, sed_labels_at_other_hop(fixed=True)["val_loader"],
                    lambda m, b: (m(b[0]).argmax(1), b[1]))


fix("sed_labels_at_other_hop", fixed_of(sed_labels_at_other_hop), _event_frame_acc,
    "val frame accuracy (labels at the feature hop)")


def _intensity_windows(n, s):
    """(n, T, 3) windows: sit / walk / jog / run share a gait frequency band and differ mainly in amplitude."""
    g = gen(s)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(50).float()
    amp = torch.tensor([0.2, 0.8, 1.6, 2.6])[y][:, None, None] * (1 + 0.1 * torch.randn(n, 1, 3, generator=g))
    f = (0.08 + 0.01 * torch.rand(n, 1, 1, generator=g))
    x = amp * torch.sin(TAU * f * t[None, :, None] + TAU * torch.rand(n, 1, 3, generator=g))
    x = x + 0.15 * torch.randn(n, 50, 3, generator=g) + torch.tensor([0.0, 0.0, 1.0])   # gravity on z
    return x, y


@case("har_per_window_zscore", "data",
      bug="Every window is z-scored with its own mean and std before training, which erases the signal amplitude "
          "that separates the activities (sit / walk / jog / run differ mainly in intensity); statistics should be "
          "fitted once on the training set.",
      cause_pattern=r"(per|each|every)[- ]?(window|sample|segment|instance|clip).{0,60}(z-?scor|normali[sz]|standardi[sz]|"
                    r"mean.{0,10}std)|(z-?scor|normali[sz]|standardi[sz])\w*.{0,60}(per|each|every|its own)[- ]?(window|"
                    r"sample|segment|instance)|(amplitude|intensity|magnitude|energy|scale).{0,60}(eras|remov|destroy|"
                    r"lost|discard|normali[sz]ed away)|(its|their) own (mean|statistics|stats)")
def har_per_window_zscore(fixed: bool = False):
    seed(0)
    x, y = _intensity_windows(1400, s=32)
    if fixed:
        mu, sd = x[:1200].mean((0, 1)), x[:1200].std((0, 1))
        x = (x - mu) / sd
    else:
        x = (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + 1e-6)

    model = nn.Sequential(nn.Flatten(), nn.Linear(150, 64), nn.ReLU(), nn.Linear(64, 4))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64), loss_fn=nn.CrossEntropyLoss(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 200, shuffle=False), max_steps=300)


fix("har_per_window_zscore", fixed_of(har_per_window_zscore), val_acc, "val accuracy")


@case("series_shuffled_before_windowing", "data",
      bug="The series' rows are shuffled (sklearn.utils.shuffle / df.sample(frac=1)) before the sliding windows are "
          "cut, so each window is a random bag of time points and its next-value target is unrelated to the inputs; "
          "only whole windows may be shuffled, by the DataLoader.",
      cause_pattern=r"shuffl\w*.{0,80}(before|prior to).{0,40}(window|lag|sequence)|(window|lag)\w*.{0,80}(after|from) "
                    r"(the )?(rows? (were|was|are) )?shuffl|temporal (order|structure).{0,60}(destroy|lost|broken|"
                    r"shuffl|scrambl)|(time|chronolog\w*) order.{0,40}(destroy|lost|broken|shuffl|scrambl)|"
                    r"df\.sample\(frac|random (bag|set) of (time )?points")
def series_shuffled_before_windowing(fixed: bool = False):
    seed(0)
    s = sine_series(1, 3200, s=33)[0]
    train, val = s[:2600], s[2600:]
    if not fixed:
        g = gen(34)
        train = train[torch.randperm(len(train), generator=g)]      # df = df.sample(frac=1) "to avoid bias"
    w = 24
    xt = train.unfold(0, w + 1, 1)
    xv = val.unfold(0, w + 1, 1)
    model = nn.Sequential(nn.Linear(w, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(xt[:, :w], xt[:, w:]), 64), loss_fn=nn.MSELoss(),
                val_loader=loader(TensorDataset(xv[:, :w], xv[:, w:]), 256, shuffle=False), max_steps=300)


fix("series_shuffled_before_windowing", fixed_of(series_shuffled_before_windowing),
    rmse_on(own_val, lambda m, b: (m(b[0]), b[1])), "val next-value RMSE", higher=False)


class ScaledStoreWindows(Dataset):
    """Per-store demand windows scaled with that store's mean / std (a scaler per series)."""

    def __init__(self, series, w, fixed):
        self.items = []
        for s in series:
            mu, sd = s.mean(), s.std()
            for i in range(0, len(s) - w - 1, 2):
                x = (s[i:i + w] - mu) / sd
                y = s[i + w]
                if fixed:
                    y = (y - mu) / sd
                self.items.append((x, y.reshape(1), mu.reshape(1), sd.reshape(1)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _store_series(n, s):
    g = gen(s)
    level = 50 + 450 * torch.rand(n, 1, generator=g)
    return level * (1 + 0.3 * sine_series(n, 160, s=s + 1, noise=0.1))


@case("per_series_scaled_inputs_raw_targets", "data",
      bug="Input windows are standardised with each store's own mean and std but the target stays in raw units, so "
          "the model must output a store level it is never shown; the target needs the same per-series scaler "
          "(and inverse_transform on the prediction).",
      cause_pattern=r"(target|label|\by\b)\w*.{0,60}(raw|unscaled|not (scaled|normali[sz]ed|standardi[sz]ed)|original "
                    r"(units|scale))|(same|per[- ]series|each series'?s?|store'?s?) (scaler|scaling|statistics|stats|mean and std)"
                    r".{0,60}(target|label)|(target|label)s?.{0,60}(same|per[- ]series|each series'?s?) (scaler|"
                    r"scaling|statistics|stats)|inverse_transform|(per|"
                    r"each)[- ](series|store).{0,80}(scal|level|mean).{0,80}(target|output)|(level|offset|scale) of "
                    r"(the|each) (series|store).{0,60}(remov|lost|hidden|not (seen|shown|available|visible))")
def per_series_scaled_inputs_raw_targets(fixed: bool = False):
    seed(0)
    series = _store_series(40, s=35)
    train, val = ScaledStoreWindows(series[:32], 24, fixed), ScaledStoreWindows(series[32:], 24, fixed)

    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 1))
    model.predicts_scaled = fixed

    def loss_fn(m, batch):
        x, y = batch[0], batch[1]
        return F.mse_loss(m(x), y)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(train, 64), loss_fn=loss_fn, val_loader=loader(val, 256, shuffle=False),
                max_steps=300)


def _raw_units(m, b):
    x, y, mu, sd = b
    p = m(x)
    if getattr(m, "predicts_scaled", False):
        return p * sd + mu, y * sd + mu
    return p, y


fix("per_series_scaled_inputs_raw_targets", fixed_of(per_series_scaled_inputs_raw_targets),
    rmse_on(own_val, _raw_units), "val RMSE in raw units", higher=False)


def _mixup_collate(fixed, n_classes=5, alpha=1.0):
    g = torch.Generator().manual_seed(36)
    beta = torch.distributions.Beta(alpha, alpha)

    def collate(items):
        x = torch.stack([it[0] for it in items])
        y = F.one_hot(torch.stack([it[1] for it in items]), n_classes).float()
        lam = beta.sample((len(x), 1))
        perm = torch.randperm(len(x), generator=g)
        perm_y = perm if fixed else torch.randperm(len(x), generator=g)
        x = lam[:, :, None] * x + (1 - lam[:, :, None]) * x[perm]
        y = lam * y + (1 - lam) * y[perm_y]
        return x, y
    return collate


@case("mixup_labels_other_permutation", "data",
      bug="The mixup collate mixes the spectrograms with one torch.randperm and the one-hot labels with a second, "
          "independent torch.randperm, so the mixed-in label belongs to a different clip than the mixed-in input.",
      cause_pattern=r"(mix-?up|mixing).{0,80}(permutation|randperm|\bperm|index|indices|shuffle)|(different|second|"
                    r"separate|independent|two) (random )?(permutation|randperm|perm|shuffle|index)s?|same "
                    r"(permutation|perm|index|indices|randperm).{0,40}(input|label|target|both)|(labels?|targets?).{0,40}"
                    r"(do not|don't|not|no longer) (match|correspond).{0,40}(mix|input|clip)")
def mixup_labels_other_permutation(fixed: bool = False):
    seed(0)
    x, y = log_mel(1400, s=37)
    train = list(zip(x[:1200], y[:1200]))
    model = nn.Sequential(nn.Flatten(), nn.Linear(16 * 32, 64), nn.ReLU(), nn.Linear(64, 5))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                train_loader=loader(train, 64, collate_fn=_mixup_collate(fixed)),
                loss_fn=lambda m, b: torch.sum(-b[1] * F.log_softmax(m(b[0]), -1), -1).mean(),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 200, shuffle=False), max_steps=300)


def _val_nll(model, kw):
    def fn(m, b):
        return F.cross_entropy(m(b[0]).float(), b[1], reduction="sum").item(), len(b[1])
    return mean_over(model, kw["val_loader"], fn)


fix("mixup_labels_other_permutation", fixed_of(mixup_labels_other_permutation), _val_nll, "val NLL",
    higher=False)
