"""Healthy: five corrected twins of broken cases and five unusual but correct setups of the domain."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bi import cases_data, cases_mechanics, cases_shapes, cases_targets, cases_trained
from benchmarks.blind_preflight_bi.cases_shapes import K, Coral
from benchmarks.blind_preflight_bi.cases_targets import two_tasks
from benchmarks.blind_preflight_bi.registry import (
    TAUS, TABLE, hetero, imbalanced, loader, mlp, ordinal, pinball, seed, tds, twin,
)

for name, builder in [("quantile_target_tiled_fixed", cases_shapes.quantile_target_tiled),
                      ("pos_weight_inverted_fixed", cases_targets.pos_weight_inverted),
                      ("coral_thresholds_buffer_fixed", cases_trained.coral_thresholds_buffer),
                      ("gaussian_nll_given_std_fixed", cases_mechanics.gaussian_nll_given_std),
                      ("collate_sorts_inputs_not_targets_fixed", cases_data.collate_sorts_inputs_not_targets)]:
    TABLE.healthy(name, f"corrected twin of {name[:-6]}")(twin(builder))


class MonotoneQuantiles(nn.Module):
    """Non-crossing quantiles: the lowest quantile plus cumulative softplus increments."""

    def __init__(self, d: int, taus=TAUS):
        super().__init__()
        self.taus = tuple(taus)
        self.net = mlp(d, len(self.taus))

    def forward(self, x):
        out = self.net(x)
        return torch.cat([out[:, :1], out[:, :1] + torch.cumsum(F.softplus(out[:, 1:]), 1)], 1)


@TABLE.healthy("quantile_non_crossing_increments", "monotone quantile heads via cumulative softplus increments, "
               "pinball loss with target minus prediction")
def quantile_non_crossing_increments() -> dict:
    seed(0)
    x, y = hetero(s=30)
    model = MonotoneQuantiles(x.shape[1])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False),
                loss_fn=lambda m, b: pinball(m(b[0]), b[1], m.taus))


class StudentT(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.net = mlp(d, 2)

    def forward(self, x):
        return self.net(x)


@TABLE.healthy("student_t_nll_fixed_dof", "heteroscedastic regression with a Student-t NLL (4 degrees of freedom) "
               "via torch.distributions and a softplus scale")
def student_t_nll_fixed_dof() -> dict:
    seed(0)
    x, y = hetero(s=31)
    model = StudentT(x.shape[1])

    def loss_fn(m, b):
        out = m(b[0])
        dist = torch.distributions.StudentT(4.0, out[:, 0], F.softplus(out[:, 1]) + 1e-3)
        return -dist.log_prob(b[1]).mean()

    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4),
                train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


class MaskedUncertainty(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.net = mlp(d, 2)
        self.log_vars = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        return self.net(x)


@TABLE.healthy("multitask_uncertainty_masked_missing", "two regression tasks with learned log-variance weights "
               "(exp(-s) L + s) and a per-task observed mask built before NaNs are filled")
def multitask_uncertainty_masked_missing() -> dict:
    seed(0)
    x, y_raw = two_tasks(s=32, missing=0.5)
    mask = (~torch.isnan(y_raw)).float()
    y = torch.nan_to_num(y_raw, nan=0.0)
    model = MaskedUncertainty(x.shape[1])

    def loss_fn(m, b):
        xb, yb, mb = b
        per_task = (((m(xb) - yb) ** 2) * mb).sum(0) / mb.sum(0).clamp_min(1)
        return (torch.exp(-m.log_vars) * per_task + m.log_vars).sum()

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tds(x[:1200], y[:1200], mask[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:], mask[1200:]), 200, shuffle=False), loss_fn=loss_fn)


class FocalBinary(nn.Module):
    """Binary focal loss (gamma 2, alpha 0.75 on the rare positives) on logits."""

    def __init__(self, gamma: float = 2.0, alpha: float = 0.75):
        super().__init__()
        self.gamma, self.alpha = gamma, alpha

    def forward(self, logits, target):
        ce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        p_t = torch.exp(-ce)
        a_t = self.alpha * target + (1 - self.alpha) * (1 - target)
        return (a_t * (1 - p_t) ** self.gamma * ce).mean()


@TABLE.healthy("binary_focal_with_sample_weighted_sampler", "binary focal loss on logits with a per-sample "
               "WeightedRandomSampler (replacement=True) for the rare positives")
def binary_focal_with_sample_weighted_sampler() -> dict:
    seed(0)
    x, y = imbalanced(s=33)
    yt = y[:1500].long()
    weights = (1.0 / torch.bincount(yt, minlength=2).float())[yt]
    sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=len(yt), replacement=True,
                                                     generator=torch.Generator().manual_seed(0))
    model = mlp(x.shape[1], 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=torch.utils.data.DataLoader(tds(x[:1500], y[:1500, None]), batch_size=64,
                                                         sampler=sampler),
                val_loader=loader(tds(x[1500:], y[1500:, None]), 250, shuffle=False), loss_fn=FocalBinary())


class CumulativeLogit(nn.Module):
    """Cumulative-link (proportional odds) model: ordered cutpoints from a first cut plus softplus gaps."""

    def __init__(self, d: int, k: int = K):
        super().__init__()
        self.score = mlp(d, 1)
        self.first = nn.Parameter(torch.tensor(-1.5))
        self.gaps = nn.Parameter(torch.zeros(k - 2))

    def forward(self, x):
        cuts = torch.cat([self.first[None], self.first + torch.cumsum(F.softplus(self.gaps) + 0.1, 0)])
        cdf = torch.sigmoid(cuts[None, :] - self.score(x))                   # P(y <= k), k = 0..K-2
        cdf = torch.cat([torch.zeros(len(x), 1), cdf, torch.ones(len(x), 1)], 1)
        return (cdf[:, 1:] - cdf[:, :-1]).clamp_min(1e-6).log()             # log P(y = k)


@TABLE.healthy("ordinal_cumulative_link_nll", "cumulative-link ordinal regression with ordered learned cutpoints and "
               "the NLL of the class probabilities (NLLLoss on log-probabilities)")
def ordinal_cumulative_link_nll() -> dict:
    seed(0)
    x, y = ordinal(s=34)
    model = CumulativeLogit(x.shape[1])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=nn.NLLLoss())


_ = Coral
