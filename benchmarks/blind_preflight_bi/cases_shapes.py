"""Shapes: tensors that broadcast or are reshaped into the wrong pairing inside the domain's own losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bi.registry import (
    TAUS, adam, balanced_accuracy, case, coral_ranks, fix, fixed_of, gaussian_nll_metric, gen, hetero, loader, mlp,
    ordinal, pinball_metric, rank_mae_metric, seed, tds,
)


class MeanLogVar(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.net = mlp(d, 2)

    def forward(self, x):
        return self.net(x)


def _mean_std_logvar(m, x):
    out = m(x)
    return out[:, 0], (0.5 * out[:, 1]).exp()


@case("hetero_nll_target_column", "shapes",
      bug="The hand-written Gaussian NLL subtracts the (B,) predicted mean from targets stored as a (B, 1) column, so "
          "(y - mu) broadcasts to a (B, B) matrix and every row's mean and log-variance are fit to every target in "
          "the batch.",
      cause_pattern=r"(gaussian|nll|log.?var|heteroscedastic|mean).{0,120}(broadcast|\(B, ?B\)|B\s*x\s*B|every target|"
                    r"all targets|pairwise|outer)|(broadcast|\(B, ?B\)|pairwise).{0,120}(gaussian|nll|log.?var|"
                    r"heteroscedastic|predicted mean)|(column|\(B, ?1\)|\[:, ?None\]|unsqueeze).{0,80}(nll|log.?var|"
                    r"gaussian).{0,80}(squeeze|view\(-1\)|flatten|reshape)")
def hetero_nll_target_column(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero()
    y = y[:, None]  # targets kept as a column, as read from a table
    model = MeanLogVar(x.shape[1])

    def loss_fn(m, batch):
        xb, yb = batch
        yb = yb.view(-1) if fixed else yb
        out = m(xb)
        mu, logvar = out[:, 0], out[:, 1]
        return (0.5 * (logvar + (yb - mu) ** 2 * torch.exp(-logvar))).mean()

    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


fix("hetero_nll_target_column", fixed_of(hetero_nll_target_column), gaussian_nll_metric(_mean_std_logvar),
    "val Gaussian NLL", higher=False)


class QuantileNet(nn.Module):
    def __init__(self, d: int, taus=TAUS):
        super().__init__()
        self.taus = tuple(taus)
        self.net = mlp(d, len(self.taus))

    def forward(self, x):
        return self.net(x)


@case("quantile_target_tiled", "shapes",
      bug="The pinball loss flattens the (B, Q) quantile predictions row by row but builds the matching targets with "
          "y.repeat(Q) (tiling the batch) instead of y.repeat_interleave(Q), so each quantile is scored against "
          "another row's target.",
      cause_pattern=r"repeat_interleave|(repeat|tile|tiling|tiled).{0,120}(target|quantile|pinball|row|sample)|"
                    r"(quantile|pinball).{0,150}(another|other|wrong|different|misalign|mismatch\w*).{0,40}"
                    r"(row|sample|target|example)|(target|row|sample)s?.{0,60}(misalign|paired with the wrong|"
                    r"out of order).{0,80}(quantile|pinball)")
def quantile_target_tiled(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero(s=3)
    model = QuantileNet(x.shape[1])
    taus = torch.tensor(TAUS)

    def loss_fn(m, batch):
        xb, yb = batch
        q = m(xb).reshape(-1)                       # row-major: sample 0's quantiles, then sample 1's ...
        t = yb.repeat_interleave(len(TAUS)) if fixed else yb.repeat(len(TAUS))
        tau = taus.repeat(len(yb))
        err = t - q
        return torch.maximum(tau * err, (tau - 1) * err).mean()

    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


fix("quantile_target_tiled", fixed_of(quantile_target_tiled), pinball_metric(lambda m, x: m(x)), "val pinball",
    higher=False)


K = 5


class Coral(nn.Module):
    """CORAL: one shared score and K-1 learned thresholds."""

    def __init__(self, d: int, k: int = K):
        super().__init__()
        self.body = mlp(d, 1)
        self.bias = nn.Parameter(torch.linspace(1, -1, k - 1))

    def forward(self, x):
        return self.body(x) + self.bias


@case("coral_levels_reshaped", "shapes",
      bug="The CORAL level targets are built as a (K-1, B) comparison and turned into (B, K-1) with .reshape instead "
          "of a transpose, so the binary level targets of different rows are scrambled together.",
      cause_pattern=r"(reshape|view).{0,120}(instead of|rather than|not).{0,30}(transpos|\.t\(\)|\.T\b|permute)|"
                    r"(transpos|\.t\(\)|permute).{0,120}(instead of|rather than|not).{0,30}(reshape|view)|"
                    r"(level|ordinal|coral|cumulative|threshold).{0,120}(scrambl|shuffl|mix|interleav|misalign|"
                    r"wrong rows?|other rows?)")
def coral_levels_reshaped(fixed: bool = False) -> dict:
    seed(0)
    x, y = ordinal()
    model = Coral(x.shape[1])

    def loss_fn(m, batch):
        xb, yb = batch
        grid = (torch.arange(K - 1)[:, None] < yb[None, :]).float()      # (K-1, B)
        levels = grid.t() if fixed else grid.reshape(-1, K - 1)
        return F.binary_cross_entropy_with_logits(m(xb), levels)

    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


fix("coral_levels_reshaped", fixed_of(coral_levels_reshaped), rank_mae_metric(lambda m, x: coral_ranks(m(x))),
    "val rank MAE", higher=False)


def bursts(n: int = 1500, t: int = 30, c: int = 3, s: int = 4):
    """Sensor windows (N, T, C): the label is the channel that carries a short high-amplitude burst."""
    g = gen(s)
    x = 0.3 * torch.randn(n, t, c, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    start = torch.randint(0, t - 6, (n,), generator=g)
    for i in range(n):
        x[i, start[i]:start[i] + 6, y[i]] += 2.0 * torch.sin(torch.arange(6) * 1.5)
    return x, y


class SensorConv(nn.Module):
    def __init__(self, c: int = 3, classes: int = 3, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.conv = nn.Sequential(nn.Conv1d(c, 32, 5, padding=2), nn.ReLU(), nn.Conv1d(32, 32, 5, padding=2),
                                  nn.ReLU())
        self.head = nn.Linear(32, classes)

    def forward(self, x):                       # x: (B, T, C) windows
        b, t, c = x.shape
        h = x.transpose(1, 2) if self.fixed else x.view(b, c, t)
        return self.head(self.conv(h).amax(-1))


@case("sensor_conv_view_not_transpose", "shapes",
      bug="The sensor model turns (B, T, C) windows into Conv1d's (B, C, T) layout with x.view(B, C, T) instead of "
          "x.transpose(1, 2), which interleaves time steps and channels so the convolution never sees a channel's "
          "own time series.",
      cause_pattern=r"(view|reshape).{0,120}(instead of|rather than|not).{0,30}(transpos|permute)|"
                    r"(transpos|permute).{0,120}(instead of|rather than|not).{0,30}(view|reshape)|"
                    r"(interleav|scrambl|mix\w*).{0,80}(time|channel)|(channel|time).{0,80}(interleav|scrambl)")
def sensor_conv_view_not_transpose(fixed: bool = False) -> dict:
    seed(0)
    x, y = bursts()
    model = SensorConv(fixed=fixed)
    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1100], y[:1100]), 64),
                val_loader=loader(tds(x[1100:], y[1100:]), 200, shuffle=False), loss_fn=nn.CrossEntropyLoss())


fix("sensor_conv_view_not_transpose", fixed_of(sensor_conv_view_not_transpose),
    lambda m, kw: balanced_accuracy(m, kw, lambda mm, x: mm(x).argmax(-1)), "val balanced accuracy")


def imbalanced_multiclass(n: int = 2000, d: int = 8, c: int = 4, s: int = 5):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, c, generator=g)
    logits = x @ w + torch.tensor([2.5, 0.5, 0.0, -0.5])
    return x, logits.argmax(1)


@case("focal_index_matrix", "shapes",
      bug="The focal loss picks each row's true-class probability with probs[:, y] (a (B, B) matrix of every row "
          "against every label in the batch) instead of probs.gather(1, y[:, None]), so each row is pushed toward "
          "the batch's label mix.",
      cause_pattern=r"gather|(probs?|p)\[:, ?y\]|(focal|true.class|target.class).{0,120}(\(B, ?B\)|B\s*x\s*B|matrix|"
                    r"every (label|target)|all (labels|targets)|broadcast)|(index\w*|select\w*).{0,80}(every|all) "
                    r"(label|target)s? (in|of) the batch")
def focal_index_matrix(fixed: bool = False) -> dict:
    seed(0)
    x, y = imbalanced_multiclass()
    model = mlp(x.shape[1], 4)

    def loss_fn(m, batch):
        xb, yb = batch
        logp = F.log_softmax(m(xb), -1)
        lp = logp.gather(1, yb[:, None]).squeeze(1) if fixed else logp[:, yb]
        return (-(1 - lp.exp()) ** 2 * lp).mean()

    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1500], y[:1500]), 64),
                val_loader=loader(tds(x[1500:], y[1500:]), 250, shuffle=False), loss_fn=loss_fn)


fix("focal_index_matrix", fixed_of(focal_index_matrix),
    lambda m, kw: balanced_accuracy(m, kw, lambda mm, x: mm(x).argmax(-1)), "val balanced accuracy")
