"""Targets: labels or the loss's reading of them do not say what the user means."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_af.registry import (
    acc_of,
    balanced_acc_of,
    case,
    cindex_of,
    fix,
    fixed_of,
    gen,
    loader,
    seed,
)


# --------------------------------------------------------------------------------------------- semi-supervised nodes
def labelled_graphs(n_graphs, s, n=20, c=4, labelled=0.2):
    """Random undirected graphs; node features are a noisy one-hot of the node's class; only ``labelled`` of the
    nodes carry a label, the others are stored as 0 in y with train_mask False."""
    g = gen(s)
    cls = torch.randint(0, c, (n_graphs, n), generator=g)
    a = (torch.rand(n_graphs, n, n, generator=g) < 0.15).float()
    a = ((a + a.transpose(1, 2)) > 0).float() + torch.eye(n)
    adj = a / a.sum(-1, keepdim=True)
    x = F.one_hot(cls, c).float() * 0.8 + 0.5 * torch.randn(n_graphs, n, c, generator=g)
    mask = torch.rand(n_graphs, n, generator=g) < labelled
    return x, adj, torch.where(mask, cls, torch.zeros_like(cls)), mask, cls


class MeanGCN(nn.Module):
    def __init__(self, d_in=4, d=32, c=4):
        super().__init__()
        self.l1, self.l2 = nn.Linear(2 * d_in, d), nn.Linear(2 * d, c)

    def forward(self, x, adj):
        h = torch.relu(self.l1(torch.cat([x, torch.bmm(adj, x)], -1)))
        return self.l2(torch.cat([h, torch.bmm(adj, h)], -1))


@case("af_node_loss_without_train_mask", "targets",
      bug="Semi-supervised node classification: unlabelled nodes are stored with label 0 and a train_mask, but the "
          "cross-entropy is taken over all nodes (logits vs y) instead of logits[train_mask] vs y[train_mask], so the "
          "80% unlabelled nodes teach the model that every node is class 0.",
      cause_pattern=r"(train_?mask|label(ed|led)?.?mask)|unlabel?led nodes?|"
                    r"(placeholder|dummy|filler|default) (label|class|target)s?.{0,40}(0|zero)|"
                    r"(loss|cross.entropy).{0,60}(all|every) nodes?.{0,60}(only|instead|not just|rather).{0,30}label")
def node_mask(fixed=False):
    seed(0)
    x, adj, y, mask, _ = labelled_graphs(200, 11)
    vx, vadj, _, _, vcls = labelled_graphs(80, 12)
    model = MeanGCN()

    def node_loss(model, batch):
        x, adj, y, mask = batch
        logits = model(x, adj)
        if fixed:
            return F.cross_entropy(logits[mask], y[mask])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    ones = torch.ones_like(vcls, dtype=torch.bool)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x, adj, y, mask), 16),
                val_loader=loader(TensorDataset(vx, vadj, vcls, ones), 40, shuffle=False),
                loss_fn=node_loss, max_steps=1000)


fix("af_node_loss_without_train_mask", fixed_of(node_mask),
    acc_of(lambda m, b: (m(b[0], b[1]).argmax(-1), b[2])), "val node accuracy", steps=300)


# --------------------------------------------------------------------------------------------- pos_weight
def fraud_rows(n, s):
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    score = x[:, 0] + 0.8 * x[:, 1] ** 2 - 0.6 * x[:, 2] + 0.5 * x[:, 3] * x[:, 4]
    return x, (score > 3.8).float().unsqueeze(1)


@case("af_pos_weight_inverted", "targets",
      bug="BCEWithLogitsLoss(pos_weight=n_pos / n_neg) on a 5%-positive fraud set: pos_weight is the weight of the "
          "positive class and must be n_neg / n_pos (about 19); the inverted ratio (about 0.05) weights the rare "
          "positives down twenty-fold more, so the model never predicts fraud.",
      cause_pattern=r"pos_weight.{0,120}(invert|reciprocal|n_?neg\s*/\s*n_?pos|negatives?\s*/\s*positives?|"
                    r"below 1|less than 1|< ?1|0\.0\d|upside|wrong way|backwards)|"
                    r"(invert|reciprocal|upside.down).{0,60}pos_weight")
def pos_weight(fixed=False):
    seed(0)
    (x, y), (vx, vy) = fraud_rows(4000, 13), fraud_rows(2000, 14)
    n_pos = y.sum()
    n_neg = len(y) - n_pos
    weight = n_neg / n_pos if fixed else n_pos / n_neg
    model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, y), 128), val_loader=loader(TensorDataset(vx, vy), 500, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=weight.reshape(1)), max_steps=2000)


fix("af_pos_weight_inverted", fixed_of(pos_weight),
    balanced_acc_of(lambda m, b: ((m(b[0]) > 0).long(), b[1])), "val balanced accuracy", steps=300)


# --------------------------------------------------------------------------------------------- ordinal grades
GRADES = ["low", "medium", "high", "very high"]


def graded_rows(n, s, alphabetical):
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    z = x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(n, generator=g)
    grade = torch.bucketize(z, torch.tensor([-0.8, 0.0, 0.8]))
    names = [GRADES[i] for i in grade.tolist()]
    classes = sorted(GRADES) if alphabetical else GRADES  # LabelEncoder sorts; OrdinalEncoder(categories=[GRADES])
    return x, torch.tensor([classes.index(v) for v in names])


class CoralHead(nn.Module):
    """Ordinal regression (CORAL): one score, K-1 ordered thresholds, P(y > k) = sigmoid(score - t_k)."""

    def __init__(self, k=4):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.thresholds = nn.Parameter(torch.linspace(-1, 1, k - 1))

    def forward(self, x):
        return self.trunk(x) - self.thresholds  # (B, K-1) cumulative logits


def coral_loss(model, batch):
    x, y = batch
    logits = model(x)
    levels = (y[:, None] > torch.arange(logits.shape[1], device=y.device)).float()
    return F.binary_cross_entropy_with_logits(logits, levels)


@case("af_ordinal_alphabetical_codes", "targets",
      bug="The grades low < medium < high < very high are encoded with LabelEncoder, which sorts the strings "
          "alphabetically (high=0, low=1, medium=2, very high=3); the CORAL ordinal loss assumes the codes follow the "
          "grade order, so its cumulative targets y > k describe a non-monotone order the single score cannot fit.",
      cause_pattern=r"alphabetic|lexicograph|LabelEncoder.{0,80}(sort|order)|OrdinalEncoder\(categories|"
                    r"(ordinal|grade|rank).{0,80}(order|ordering).{0,60}(lost|broken|wrong|not (the|their|preserved))|"
                    r"codes?.{0,40}(do not|don't|doesn't) follow.{0,30}(order|grade)|non.?monoton")
def ordinal_codes(fixed=False):
    seed(0)
    (x, y), (vx, vy) = graded_rows(3000, 15, not fixed), graded_rows(1000, 16, not fixed)
    model = CoralHead()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x, y), 64), val_loader=loader(TensorDataset(vx, vy), 250, shuffle=False),
                loss_fn=coral_loss, max_steps=2000)


fix("af_ordinal_alphabetical_codes", fixed_of(ordinal_codes),
    acc_of(lambda m, b: ((m(b[0]) > 0).sum(-1), b[1])), "val accuracy (in the case's own codes)", steps=300)


# --------------------------------------------------------------------------------------------- survival
def survival_rows(n, s, censoring=1.0):
    """Covariates, observed time = min(event time, censoring time) and a `censored` column (1 = censored);
    ``censoring``: the censoring hazard relative to the one giving about 40% censored rows."""
    g = gen(s)
    x = torch.randn(n, 6, generator=g)
    risk = x @ torch.tensor([1.0, -0.8, 0.6, 0.0, 0.4, 0.0])
    t_event = torch.empty(n).exponential_(generator=g) / risk.exp()
    t_cens = torch.empty(n).exponential_(generator=g) * 1.2 / censoring
    time = torch.minimum(t_event, t_cens)
    return x, time, (t_cens < t_event).float()


def cox_loss(risk, time, event):
    order = torch.argsort(time, descending=True)
    risk, event = risk[order], event[order]
    return -((risk - torch.logcumsumexp(risk, 0)) * event).sum() / event.sum().clamp_min(1.0)


@case("af_survival_censor_flag_as_event", "targets",
      bug="The data's status column is `censored` (1 = censored, about 45% of rows) and it is passed to the Cox partial "
          "likelihood as the event indicator; the loss then models the censoring times as deaths and learns a risk "
          "ranking that is inverted (C-index below 0.5) instead of using event = 1 - censored.",
      cause_pattern=r"censor\w*.{0,60}(as|for|instead of|in place of|treated as).{0,20}(the )?event|"
                    r"event.{0,40}(indicator|flag|column).{0,60}(invert|flipped|reversed|censor)|"
                    r"1\s*-\s*censored|invert\w* (event|censor)")
def censor_flag(fixed=False):
    seed(0)
    x, t, c = survival_rows(3000, 17)
    vx, vt, vc = survival_rows(600, 18)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))

    def cox(model, batch):
        x, time, censored = batch
        event = 1.0 - censored if fixed else censored
        return cox_loss(model(x).squeeze(-1), time, event)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x, t, c), 128), val_loader=loader(TensorDataset(vx, vt, vc), 600, shuffle=False),
                loss_fn=cox, max_steps=1000)


fix("af_survival_censor_flag_as_event", fixed_of(censor_flag),
    cindex_of(lambda m, b: (m(b[0]).squeeze(-1), torch.stack([b[1], 1.0 - b[2]], 1))), "val C-index", steps=300)


# --------------------------------------------------------------------------------------------- pairwise ranking
def doc_pairs(n, s):
    """(features of the more relevant document, features of the less relevant one)."""
    g = gen(s)
    a, b = torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g)

    def rel(d):
        return d[:, 0] + torch.tanh(d[:, 1] * d[:, 2]) - 0.5 * d[:, 3]
    swap = (rel(a) < rel(b))[:, None]
    return torch.where(swap, b, a), torch.where(swap, a, b)


@case("af_margin_ranking_target_flipped", "targets",
      bug="nn.MarginRankingLoss(score_neg, score_pos, target=1): target 1 means the FIRST input should rank higher, "
          "so with the less relevant document first the loss trains every irrelevant document above the relevant "
          "one; the arguments must be (score_pos, score_neg, 1) or the target -1.",
      cause_pattern=r"MarginRankingLoss|margin_ranking|"
                    r"target.{0,40}(1|one).{0,60}first (input|argument|score).{0,40}(higher|rank)|"
                    r"(arguments?|inputs?|scores?).{0,30}(swapped|reversed|wrong order)|"
                    r"(relevant|positive)\w* .{0,40}(below|under|lower than).{0,30}(irrelevant|negative)|"
                    r"irrelevant.{0,40}above.{0,20}relevant")
def margin_ranking(fixed=False):
    seed(0)
    (p, q), (vp, vq) = doc_pairs(3000, 19), doc_pairs(1000, 20)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    criterion = nn.MarginRankingLoss(margin=0.5)

    def pair_loss(model, batch):
        pos, neg = batch
        s_pos, s_neg = model(pos).squeeze(-1), model(neg).squeeze(-1)
        ones = torch.ones_like(s_pos)
        return criterion(s_pos, s_neg, ones) if fixed else criterion(s_neg, s_pos, ones)

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(p, q), 64), val_loader=loader(TensorDataset(vp, vq), 250, shuffle=False),
                loss_fn=pair_loss, max_steps=2000)


fix("af_margin_ranking_target_flipped", fixed_of(margin_ranking),
    acc_of(lambda m, b: ((m(b[0]) > m(b[1])).long().squeeze(-1), torch.ones(len(b[0]), dtype=torch.long))),
    "val pairwise accuracy", steps=300)
