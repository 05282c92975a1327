"""Mechanics: the domain's machinery used with the wrong semantics (loss weighting, variance arguments, samplers,
padded sequences, BCE weights)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bi.cases_trained import TwoNets, mean_std
from benchmarks.blind_preflight_bi.registry import (
    balanced_accuracy, case, fix, fixed_of, gaussian_nll_metric, gen, hetero, imbalanced, loader, mean_over, mlp,
    rank_mae_metric, rmse_metric, seed, tds,
)


K = 5


class CoralHead(nn.Module):
    def __init__(self, d: int, k: int = K):
        super().__init__()
        self.body = mlp(d, 1)
        self.bias = nn.Parameter(torch.linspace(1, -1, k - 1))

    def forward(self, x):
        return self.body(x) + self.bias


@case("coral_levels_with_cross_entropy", "mechanics",
      bug="The CORAL level targets (several 1s per row) are trained with F.cross_entropy as soft class "
          "probabilities instead of binary_cross_entropy_with_logits per level, so the K-1 levels compete in one "
          "softmax while ranks are decoded from per-level sigmoids.",
      cause_pattern=r"cross.?entropy.{0,150}(instead of|rather than|not).{0,40}(binary|bce|sigmoid)|(binary|bce|"
                    r"binary_cross_entropy).{0,150}(instead of|rather than|not).{0,60}(softmax|cross.?entropy)|"
                    r"(level|ordinal|coral).{0,150}(softmax|compete|mutually exclusive)")
def coral_levels_with_cross_entropy(fixed: bool = False) -> dict:
    seed(0)
    from benchmarks.blind_preflight_bi.registry import ordinal
    x, y = ordinal(s=13)
    model = CoralHead(x.shape[1])

    def loss_fn(m, batch):
        xb, yb = batch
        levels = (yb[:, None] > torch.arange(K - 1)[None, :]).float()
        logits = m(xb)
        return F.binary_cross_entropy_with_logits(logits, levels) if fixed else F.cross_entropy(logits, levels)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


fix("coral_levels_with_cross_entropy", fixed_of(coral_levels_with_cross_entropy),
    rank_mae_metric(lambda m, x: (torch.sigmoid(m(x)) > 0.5).sum(1)), "val rank MAE", higher=False)


@case("gaussian_nll_given_std", "mechanics",
      bug="F.gaussian_nll_loss is passed the softplus scale (a standard deviation) as its var argument, so the "
          "network's 'scale' learns the variance and the intervals read from it as a std are far too narrow.",
      cause_pattern=r"(var\b|variance).{0,150}(std|standard deviation|scale|sigma)|(std|standard deviation|scale|"
                    r"sigma).{0,150}(as|for|instead of|where).{0,40}(var\b|variance)|(square|\*\* ?2|\^2)")
def gaussian_nll_given_std(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero(s=14)
    model = TwoNets(x.shape[1])

    def loss_fn(m, batch):
        out = m(batch[0])
        scale = out[:, 1]
        return F.gaussian_nll_loss(out[:, 0], batch[1], scale ** 2 if fixed else scale)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


fix("gaussian_nll_given_std", fixed_of(gaussian_nll_given_std), gaussian_nll_metric(mean_std), "val Gaussian NLL",
    higher=False)


@case("weighted_sampler_no_replacement", "mechanics",
      bug="The WeightedRandomSampler meant to oversample the rare positives is built with replacement=False and "
          "num_samples=len(dataset), so each epoch is just a permutation of the data and no rebalancing happens.",
      cause_pattern=r"replacement.{0,150}(false|permutation|no (re)?balanc|no oversampl|each (row|sample) once)|"
                    r"(permutation|each (row|sample|example) (exactly )?once).{0,150}(sampler|oversampl|rebalanc)|"
                    r"sampler.{0,150}(permutation|replacement)")
def weighted_sampler_no_replacement(fixed: bool = False) -> dict:
    seed(0)
    x, y = imbalanced(s=15)
    xt, yt = x[:1500], y[:1500]
    counts = torch.bincount(yt.long(), minlength=2).float()
    weights = (1.0 / counts)[yt.long()]
    sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=len(yt), replacement=fixed,
                                                     generator=torch.Generator().manual_seed(0))
    model = mlp(x.shape[1], 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=torch.utils.data.DataLoader(tds(xt, yt[:, None]), batch_size=64, sampler=sampler),
                val_loader=loader(tds(x[1500:], y[1500:]), 250, shuffle=False), loss_fn=nn.BCEWithLogitsLoss())


fix("weighted_sampler_no_replacement", fixed_of(weighted_sampler_no_replacement), balanced_accuracy,
    "val balanced accuracy")


def padded_sequences(n: int = 1200, t: int = 40, c: int = 2, s: int = 16):
    """Zero-padded sensor sequences of length 8..40; the target is the last real reading of channel 0 plus the
    mean of channel 1."""
    g = gen(s)
    lengths = torch.randint(8, t + 1, (n,), generator=g)
    x = torch.randn(n, t, c, generator=g)
    x = x * (torch.arange(t)[None, :, None] < lengths[:, None, None])
    last = x[torch.arange(n), lengths - 1, 0]
    y = last + x[:, :, 1].sum(1) / lengths
    return x, lengths, y


class LastStepGRU(nn.Module):
    def __init__(self, c: int = 2, h: int = 32, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.gru = nn.GRU(c, h, batch_first=True)
        self.head = nn.Linear(h, 1)

    def forward(self, x, lengths):
        out, _ = self.gru(x)
        last = out[torch.arange(len(x)), lengths - 1] if self.fixed else out[:, -1]
        return self.head(last).squeeze(-1)


def gru_loss(m, batch):
    x, lengths, y = batch
    return F.mse_loss(m(x, lengths), y)


@case("gru_reads_padded_last_step", "mechanics",
      bug="The GRU regressor reads out[:, -1], the output at the last padded position, instead of the output at "
          "each sequence's true last step lengths - 1, so short sequences are summarised after many zero-padding "
          "steps.",
      cause_pattern=r"(out\[:, ?-1\]|last (padded )?(position|time ?step|step)|final (padded )?(position|step)).{0,"
                    r"150}(pad|length)|(length|lengths ?- ?1|true last|pack_padded).{0,150}(instead|rather|not|"
                    r"pad)|pad\w*.{0,100}(last|final) (step|output|hidden)")
def gru_reads_padded_last_step(fixed: bool = False) -> dict:
    seed(0)
    x, lengths, y = padded_sequences()
    model = LastStepGRU(fixed=fixed)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tds(x[:900], lengths[:900], y[:900]), 32),
                val_loader=loader(tds(x[900:], lengths[900:], y[900:]), 150, shuffle=False), loss_fn=gru_loss)


fix("gru_reads_padded_last_step", fixed_of(gru_reads_padded_last_step),
    rmse_metric(lambda m, b: (m(b[0], b[1]), b[2])), "val RMSE", higher=False)


@case("bce_weight_instead_of_pos_weight", "mechanics",
      bug="The class-imbalance factor is passed as BCEWithLogitsLoss(weight=...) instead of pos_weight=..., which "
          "scales every element's loss by the same constant and leaves the rare positives unweighted.",
      cause_pattern=r"weight=.{0,150}(instead of|rather than|not).{0,40}pos_weight|pos_weight.{0,150}(instead of|"
                    r"rather than|not).{0,40}weight=|weight.{0,100}(every|all|each) (element|sample|row|example)s?"
                    r".{0,80}(same|constant|equally)")
def bce_weight_instead_of_pos_weight(fixed: bool = False) -> dict:
    seed(0)
    x, y = imbalanced(s=17)
    ratio = ((1 - y[:1500]).sum() / y[:1500].sum()).reshape(1)
    model = mlp(x.shape[1], 1)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=ratio) if fixed else nn.BCEWithLogitsLoss(weight=ratio)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tds(x[:1500], y[:1500, None]), 64),
                val_loader=loader(tds(x[1500:], y[1500:]), 250, shuffle=False), loss_fn=loss_fn)


fix("bce_weight_instead_of_pos_weight", fixed_of(bce_weight_instead_of_pos_weight), balanced_accuracy,
    "val balanced accuracy")

_ = (math, mean_over)
