"""Targets: the domain's targets built wrong (levels, pinball sign, missing-target masks, pos_weight, task columns)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.blind_preflight_bi.cases_shapes import K, Coral, QuantileNet
from benchmarks.blind_preflight_bi.registry import (
    adam, balanced_accuracy, case, coral_ranks, fix, fixed_of, gen, hetero, imbalanced, loader, mean_over, mlp,
    ordinal, pinball_metric, rank_mae_metric, seed, tds,
)


@case("coral_levels_ge", "targets",
      bug="The CORAL level targets use y >= k instead of y > k, so the first binary level is always 1 and every "
          "rank is decoded one step too high.",
      cause_pattern=r">=|greater.or.equal|off.by.one|one (step|rank|level) too high|(level|threshold|cumulative).{0,"
                    r"100}(always (1|one|true|positive)|shifted)")
def coral_levels_ge(fixed: bool = False) -> dict:
    seed(0)
    x, y = ordinal()
    model = Coral(x.shape[1])

    def loss_fn(m, batch):
        xb, yb = batch
        ks = torch.arange(K - 1)[None, :]
        levels = (yb[:, None] > ks).float() if fixed else (yb[:, None] >= ks).float()
        return F.binary_cross_entropy_with_logits(m(xb), levels)

    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


fix("coral_levels_ge", fixed_of(coral_levels_ge), rank_mae_metric(lambda m, x: coral_ranks(m(x))), "val rank MAE",
    higher=False)


@case("pinball_sign_flipped", "targets",
      bug="The pinball loss computes the error as prediction minus target instead of target minus prediction, so "
          "the head for level tau learns the 1 - tau quantile and the 0.1 and 0.9 quantiles swap.",
      cause_pattern=r"(sign|pred\w* minus target|pred\w* - (y|target)|q - y).{0,120}(pinball|quantile|1 ?- ?tau)|"
                    r"(pinball|quantile).{0,150}(sign|flipped|revers|swap|1 ?- ?tau|target minus pred|y - q)")
def pinball_sign_flipped(fixed: bool = False) -> dict:
    seed(0)
    x, y = hetero(s=6)
    model = QuantileNet(x.shape[1])
    taus = torch.tensor(model.taus)

    def loss_fn(m, batch):
        xb, yb = batch
        q = m(xb)
        err = (yb[:, None] - q) if fixed else (q - yb[:, None])
        return torch.maximum(taus * err, (taus - 1) * err).mean()

    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1200], y[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:]), 200, shuffle=False), loss_fn=loss_fn)


fix("pinball_sign_flipped", fixed_of(pinball_sign_flipped), pinball_metric(lambda m, x: m(x)), "val pinball",
    higher=False)


def two_tasks(n: int = 1600, d: int = 8, s: int = 7, missing: float = 0.6):
    """Two regression targets per row; task 1 is missing (NaN) on a share of the rows."""
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 2, generator=g) / d ** 0.5
    y = torch.stack([2 * torch.tanh(x @ w[:, 0]), 3 + 1.5 * torch.sin(x @ w[:, 1])], 1)
    y = y + 0.1 * torch.randn(n, 2, generator=g)
    y[torch.rand(n, generator=g) < missing, 1] = float("nan")
    return x, y


def masked_mse(m, batch):
    xb, yb, mb = batch
    return (((m(xb) - yb) ** 2) * mb).sum() / mb.sum().clamp_min(1)


def per_task_rmse(m, kw):
    """Mean over tasks of the held-out RMSE on observed targets."""
    out = []
    for t in range(2):
        def fn(mm, b, t=t):
            p, y, mask = mm(b[0])[:, t], b[1][:, t], b[2][:, t]
            return (((p - y) ** 2) * mask).sum().item(), mask.sum().item()
        out.append(math.sqrt(mean_over(m, kw["val_loader"], fn)))
    return sum(out) / 2


@case("multitask_mask_after_fill", "targets",
      bug="The per-task observed mask is computed with ~isnan(y) after the missing targets were already filled with "
          "0 by nan_to_num, so the mask is all ones and the second task is trained toward 0 on every missing row.",
      cause_pattern=r"(mask|observed).{0,150}(after|already).{0,80}(fill|nan_to_num|imput|zero)|(nan_to_num|"
                    r"fill\w*).{0,150}(before|prior).{0,60}mask|mask.{0,60}all (ones|true|1)|missing.{0,100}(trained|"
                    r"fit|regress\w*|pull\w*|push\w*) (toward|to) (0|zero)")
def multitask_mask_after_fill(fixed: bool = False) -> dict:
    seed(0)
    x, y_raw = two_tasks()
    y = torch.nan_to_num(y_raw, nan=0.0)
    mask = (~torch.isnan(y_raw if fixed else y)).float()
    val_mask = (~torch.isnan(y_raw)).float()
    model = mlp(x.shape[1], 2)
    return dict(model=model, optimizer=adam(model),
                train_loader=loader(tds(x[:1200], y[:1200], mask[:1200]), 64),
                val_loader=loader(tds(x[1200:], y[1200:], val_mask[1200:]), 200, shuffle=False), loss_fn=masked_mse)


fix("multitask_mask_after_fill", fixed_of(multitask_mask_after_fill), per_task_rmse, "val per-task RMSE",
    higher=False)


@case("pos_weight_inverted", "targets",
      bug="BCEWithLogitsLoss gets pos_weight = n_pos / n_neg instead of n_neg / n_pos, so the rare positive class is "
          "weighted down about 16x more instead of up.",
      cause_pattern=r"pos_weight.{0,150}(invert|inverse|recipro|upside|n_pos ?/ ?n_neg|pos\w* ?/ ?neg|down|"
                    r"less than (1|one)|below (1|one)|< ?1)|(n_neg ?/ ?n_pos|neg\w* ?/ ?pos\w*).{0,80}(instead|rather)")
def pos_weight_inverted(fixed: bool = False) -> dict:
    seed(0)
    x, y = imbalanced()
    n_pos, n_neg = y[:1500].sum(), (1 - y[:1500]).sum()
    pos_weight = (n_neg / n_pos) if fixed else (n_pos / n_neg)
    model = mlp(x.shape[1], 1)
    return dict(model=model, optimizer=adam(model), train_loader=loader(tds(x[:1500], y[:1500, None]), 64),
                val_loader=loader(tds(x[1500:], y[1500:]), 250, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight.reshape(1)))


fix("pos_weight_inverted", fixed_of(pos_weight_inverted), balanced_accuracy, "val balanced accuracy")


class TwoTaskDataset(torch.utils.data.Dataset):
    def __init__(self, x, y, swap: bool):
        self.x, self.y, self.swap = x, y, swap

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        y = self.y[i]
        target = y.flip(0) if self.swap else y
        return self.x[i], target, torch.ones(2)


@case("multitask_task_columns_swapped", "targets",
      bug="The training Dataset returns the two task targets in reversed column order (y.flip(0)), so each task head "
          "is trained on the other task's target while the validation columns are in the right order.",
      cause_pattern=r"(swap|revers|flip|other task|wrong (task|column|head)).{0,150}(task|column|head|target)|"
                    r"(task|column|head|target).{0,150}(swap|revers|flip|other task's|wrong (task|column|head))")
def multitask_task_columns_swapped(fixed: bool = False) -> dict:
    seed(0)
    x, y = two_tasks(missing=0.0)
    model = mlp(x.shape[1], 2)
    return dict(model=model, optimizer=adam(model),
                train_loader=loader(TwoTaskDataset(x[:1200], y[:1200], swap=not fixed), 64),
                val_loader=loader(TwoTaskDataset(x[1200:], y[1200:], swap=False), 200, shuffle=False),
                loss_fn=masked_mse)


fix("multitask_task_columns_swapped", fixed_of(multitask_task_columns_swapped), per_task_rmse, "val per-task RMSE",
    higher=False)
