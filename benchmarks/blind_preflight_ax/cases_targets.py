"""Targets: labels that train the model towards the wrong thing."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ax.cases_shapes import ListScorer, StackedFieldsCTR, TwoTower, two_tower_data
from benchmarks.blind_preflight_ax.registry import case, gen, loader, ltr, seed, tabular


@case("targets_rank_position_as_relevance", "targets",
      "The listwise (ListNet) target is softmax over the documents' rank positions (1 = best) exported from the "
      "search log, used as if larger meant more relevant, so the model learns to put the worst documents first.",
      r"rank position|position.{0,40}(relevance|grade|label)|(invert|revers|flip|negat).{0,60}(relevance|rank|label|"
      r"order|grade)|(1 ?= ?best|lower is better|higher is better|larger.{0,20}(more|better) relevant)|"
      r"(relevance|grade).{0,40}(instead|not).{0,30}rank|-rank|max_rank ?- ?rank")
def targets_rank_position_as_relevance(fixed=False):
    seed(0)
    x, g = ltr(400, 10, s=11)
    position = (-g).argsort(dim=1, stable=True).argsort(dim=1).float() + 1      # 1 = best document of the query
    target = g if fixed else position

    def listnet(model, batch):
        xb, tb = batch[0], batch[1]
        return -(torch.softmax(tb, 1) * torch.log_softmax(model(xb).squeeze(-1), 1)).sum(1).mean()
    model = ListScorer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:320], target[:320]), 16),
                val_loader=loader(TensorDataset(x[320:], g[320:]), 40, shuffle=False),
                loss_fn=listnet, max_steps=300)


@case("targets_pm1_labels_bce", "targets",
      "The click labels come in the ranking convention {-1, +1} and go straight into BCEWithLogitsLoss, which "
      "expects targets in [0, 1]; a -1 target pushes the logit down without bound, so the negatives dominate.",
      r"\{-1, ?\+?1\}|-1(?!\d).{0,30}(and|or|/|,) ?\+?1\b|\(y ?\+ ?1\) ?/ ?2|(label|target)s? (of|equal to|="
      r") ?-1(?!\d)|negative (label|target)s?|labels? in \{0, ?1\}|targets? in \[0, ?1\]|-1 (labels|targets)"
      r"|(labels|targets) (are|of) -1")
def targets_pm1_labels_bce(fixed=False):
    seed(0)
    cats, nums, y = tabular(3000, s=12)
    labels = y if fixed else y * 2 - 1
    model = StackedFieldsCTR(fixed=True)
    crit = nn.BCEWithLogitsLoss()

    def loss(m, b):
        return crit(m(b[0], b[1]), b[2])
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(cats[:2400], nums[:2400], labels[:2400]), 64),
                val_loader=loader(TensorDataset(cats[2400:], nums[2400:], y[2400:]), 200, shuffle=False),
                loss_fn=loss, max_steps=300)


class RatingMLP(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


@case("targets_rating_threshold_off_by_one", "targets",
      "The 'liked' label is built as (rating > 5) on a 1-5 star scale instead of (rating >= 4) / (rating > 3), so "
      "every target is 0 and the model only learns to predict 'not liked'.",
      r"(rating|stars?).{0,40}(> ?5|>= ?4|> ?3|threshold|cut-?off)|threshold|off[- ]by[- ]one|> ?5.{0,40}(ne"
      r"ver|no |impossible)|no rating (is )?above 5|(label|target)s?.{0,60}cut-?off")
def targets_rating_threshold_off_by_one(fixed=False):
    seed(0)
    g = gen(13)
    x = torch.randn(3000, 6, generator=g)
    raw = x @ torch.randn(6, generator=g) + 0.3 * torch.randn(3000, generator=g)
    rating = torch.bucketize(raw, raw.quantile(torch.tensor([0.2, 0.4, 0.6, 0.8]))) + 1   # 1..5 stars
    liked = (rating >= 4).float()
    target = liked if fixed else (rating > 5).float()
    model = RatingMLP()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2400], target[:2400]), 64),
                val_loader=loader(TensorDataset(x[2400:], liked[2400:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


@case("targets_pairwise_sign_flipped", "targets",
      "The RankNet pair label is P(i beats j) = (grade_i > grade_j) but the logit fed to BCE is s_j - s_i "
      "(reversed), so the model learns to score less relevant documents higher.",
      r"s_?j ?- ?s_?i|s_?i ?- ?s_?j|sign|(revers|flip|invert|swap).{0,60}(pair|order|differen|score|label)|"
      r"(pair|differen).{0,60}(revers|flip|invert|swap|wrong (order|direction))|wrong direction")
def targets_pairwise_sign_flipped(fixed=False):
    seed(0)
    x, g = ltr(400, 10, s=14)
    i, j = torch.triu_indices(10, 10, 1)

    def ranknet(model, batch):
        xb, gb = batch
        s = model(xb).squeeze(-1)
        diff = s[:, i] - s[:, j] if fixed else s[:, j] - s[:, i]
        label = (gb[:, i] > gb[:, j]).float()
        keep = gb[:, i] != gb[:, j]
        return F.binary_cross_entropy_with_logits(diff[keep], label[keep])
    model = ListScorer()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:320], g[:320]), 16),
                val_loader=loader(TensorDataset(x[320:], g[320:]), 40, shuffle=False),
                loss_fn=ranknet, max_steps=300)


@case("targets_in_batch_labels_zeros", "targets",
      "The in-batch-negatives retrieval loss is cross_entropy(u @ v.T, labels) with labels = torch.zeros(B) "
      "instead of torch.arange(B): every query is told its positive is the first item of the batch.",
      r"arange|zeros|diagonal|labels? ?= ?.{0,20}(0|zero)|(positive|target).{0,60}(index|position|diagonal|first "
      r"(item|column))|in-batch.{0,60}(label|target)|(label|target)s?.{0,60}in-batch")
def targets_in_batch_labels_zeros(fixed=False):
    seed(0)
    users, items, y = two_tower_data(s=15, n=12000)
    users_all, items_all, y_all = users[10000:], items[10000:], y[10000:]
    users, items = users[:10000][y[:10000] > 0], items[:10000][y[:10000] > 0]

    def in_batch(model, batch):
        u, v = model.u(batch[0]), model.i(batch[1])
        logits = u @ v.t()
        labels = (torch.arange(len(u), device=logits.device) if fixed
                  else torch.zeros(len(u), dtype=torch.long, device=logits.device))
        return F.cross_entropy(logits, labels)
    model = TwoTower(fixed=True)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                train_loader=loader(TensorDataset(users, items), 64, drop_last=True),
                val_loader=loader(TensorDataset(users_all, items_all, y_all), 500, shuffle=False),
                loss_fn=in_batch, max_steps=300)
