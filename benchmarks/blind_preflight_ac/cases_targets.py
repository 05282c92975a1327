"""Set ac, family targets: what the model is asked to predict is not what the user thinks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ac.registry import case, fix, fixed_of, gen, loader, on_tensors, seed


def mlp(d_in, d_out, hidden=64):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


# --- the label column min-max scaled with the features ----------------------------------------------------------

def wine_table(n, s):
    """A 'wine quality' table: 10 features and a quality grade 0..3 (nonlinear in the features)."""
    g = gen(s)
    x = torch.randn(n, 10, generator=g)
    score = x[:, 0] + 0.8 * x[:, 1] * x[:, 2] + 0.6 * torch.sin(2 * x[:, 3])
    y = torch.bucketize(score, torch.tensor([-0.8, 0.0, 0.8]))
    return x, y


def minmax_all_columns(table):
    lo, hi = table.min(0).values, table.max(0).values
    return (table - lo) / (hi - lo)


@case("label_column_minmax_scaled", "targets",
      bug="The whole table, label column included, is min-max scaled before the split, and the labels are then "
          "cast back with .long(): grades 0, 1, 2, 3 become 0.0, 0.33, 0.67, 1.0 and truncate to 0, 0, 0, 1, so the "
          "classifier only ever sees two of the four classes.",
      cause_pattern=r"label column|(min.?max|MinMaxScaler)\w*.{0,80}(label|target)|(label|target)s?.{0,80}(min.?max|"
                    r"scaled (to|into|with)|fractions?\b|truncat|\.long\(\)|\bcast (back )?(to|with))|only (two|2) "
                    r"(of|distinct|class|label)|(two|2) (distinct )?(label|class)(es)? (values? )?(out of|of|instead of) "
                    r"(the )?(four|4)")
def label_column_minmax_scaled(fixed=False):
    seed(0)
    x, y = wine_table(2000, 11)
    table = torch.cat([x, y.float().unsqueeze(1)], 1)
    if fixed:
        table = torch.cat([minmax_all_columns(table[:, :-1]), table[:, -1:]], 1)
    else:
        table = minmax_all_columns(table)
    feats, labels = table[:, :-1], table[:, -1].long()
    model = mlp(10, 4)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(feats[:1500], labels[:1500]), 32),
                val_loader=loader(TensorDataset(feats[1500:], labels[1500:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1500)


def wine_accuracy(model, kw):
    x, y = wine_table(2000, 11)
    feats = minmax_all_columns(x)
    return on_tensors(model, lambda m: (m(feats[1500:]).argmax(-1) == y[1500:]).float().mean().item())


fix("label_column_minmax_scaled", fixed_of(label_column_minmax_scaled), wine_accuracy,
    "val accuracy on the true grades", steps=300)


# --- MSE on class ids --------------------------------------------------------------------------------------------

def segment_table(n, s):
    """Customer segments (5, unordered) from a random teacher on 12 features."""
    g = gen(s)
    x = torch.randn(n, 12, generator=g)
    w = torch.randn(12, 5, generator=g)
    return x, (x @ w).argmax(1)


def regress_on_id(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(1), y.float())


@case("mse_regression_on_class_ids", "targets",
      bug="Five unordered customer segments are learned as a regression: one output unit and MSELoss against the "
          "class id as a float, predictions rounded; ids 0-4 have no order, so the model averages between segments "
          "instead of separating them (CrossEntropyLoss over 5 logits is what fits).",
      cause_pattern=r"(mse|mean.squared|regress)\w*.{0,100}(class|categor|label id|segment)|"
                    r"(class|categor|segment)\w*.{0,100}(mse|mean.squared|regress|ordinal|unordered|no order)|"
                    r"(one|single|1) output (unit|neuron|logit)|CrossEntropyLoss over")
def mse_regression_on_class_ids(fixed=False):
    seed(0)
    x, y = segment_table(2000, 12)
    model = mlp(12, 5 if fixed else 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1500], y[:1500]), 32),
                val_loader=loader(TensorDataset(x[1500:], y[1500:]), 128, shuffle=False),
                loss_fn=nn.CrossEntropyLoss() if fixed else regress_on_id, max_steps=1500)


def segment_predict(out):
    return out.argmax(-1) if out.size(-1) > 1 else out.squeeze(-1).round().clamp(0, 4).long()


def segment_accuracy(model, kw):
    x, y = segment_table(2000, 12)
    return on_tensors(model, lambda m: (segment_predict(m(x[1500:])) == y[1500:]).float().mean().item())


fix("mse_regression_on_class_ids", fixed_of(mse_regression_on_class_ids), segment_accuracy, "val accuracy",
    steps=300)


# --- forecasting target not shifted ------------------------------------------------------------------------------

WINDOW = 12


def load_windows(n, s):
    """Windows of an electricity-load-like series: mixtures of two periodic components plus noise. Returns the
    windows, the value right after each window and the last value inside it."""
    g = gen(s)
    t = torch.arange(WINDOW + 1).float()
    w1 = 0.4 + 0.8 * torch.rand(n, 1, generator=g)
    w2 = 1.2 + 0.8 * torch.rand(n, 1, generator=g)
    p1, p2 = 6.3 * torch.rand(n, 1, generator=g), 6.3 * torch.rand(n, 1, generator=g)
    series = torch.sin(w1 * t + p1) + 0.6 * torch.sin(w2 * t + p2) + 0.05 * torch.randn(n, WINDOW + 1, generator=g)
    return series[:, :WINDOW], series[:, WINDOW], series[:, WINDOW - 1]


@case("forecast_target_not_shifted", "targets",
      bug="The one-step-ahead forecaster's target is taken as series[i + window - 1], the last value inside the "
          "input window, instead of series[i + window]: the model learns to copy its last input (train loss near "
          "zero) and never learns to forecast the next value.",
      cause_pattern=r"(target|label|y)\w*.{0,80}(last|final) (value|step|element|point)\w*.{0,40}(input|window)|"
                    r"(target|label)s?.{0,80}(inside|within|part of|contained in|present in) the (input|window|feature)|"
                    r"(not|un)[- ]?shifted|off[- ]by[- ]one|i ?\+ ?window|(copy|copies|copying|identity)\w*.{0,40}"
                    r"(last )?(input|feature)|(target|label)s? (equal|equals|identical|leak)\w*.{0,40}(input|feature)")
def forecast_target_not_shifted(fixed=False):
    seed(0)
    x, nxt, last = load_windows(2400, 13)
    y = (nxt if fixed else last).unsqueeze(1)
    model = nn.Sequential(nn.Linear(WINDOW, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 32),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 128, shuffle=False),
                loss_fn=nn.MSELoss(), max_steps=1500)


def next_value_rmse(model, kw):
    x, nxt, _ = load_windows(2400, 13)
    return on_tensors(model, lambda m: math.sqrt(((m(x[2000:]).squeeze(1) - nxt[2000:]) ** 2).mean().item()))


fix("forecast_target_not_shifted", fixed_of(forecast_target_not_shifted), next_value_rmse,
    "val RMSE of the next value", steps=300, higher=False)


# --- multi-label tags squeezed into one class with argmax -------------------------------------------------------

N_TAGS, N_WORDS = 6, 80


def tagged_posts(n, s):
    """Bag-of-words counts (n, 80) of forum posts with 1-3 tags out of 6 (multi-hot); tag k has trigger words
    8k..8k+7, the rest (48..79) are filler."""
    g = gen(s)
    tags = torch.zeros(n, N_TAGS)
    counts = torch.zeros(n, N_WORDS)
    for i in range(n):
        k = int(torch.randint(1, 4, (1,), generator=g))
        chosen = torch.randperm(N_TAGS, generator=g)[:k]
        tags[i, chosen] = 1.0
        for t in chosen.tolist():
            counts[i, 8 * t + torch.randint(0, 8, (2,), generator=g)] += 1
        counts[i, 48 + torch.randint(0, 32, (8,), generator=g)] += 1
    return counts, tags


def first_tag_ce(model, batch):
    x, tags = batch
    return F.cross_entropy(model(x), tags.argmax(1))


@case("multilabel_tags_argmaxed_into_crossentropy", "targets",
      bug="Posts carry 1-3 of 6 tags (multi-hot), but the loss is CrossEntropyLoss against tags.argmax(1): only the "
          "lowest-index tag of each post is kept as a single class and the softmax pushes the other true tags down; "
          "a multi-label target needs BCEWithLogitsLoss on the multi-hot vector.",
      cause_pattern=r"multi[- ]?(label|hot)|argmax.{0,80}(tag|label|target|one[- ]hot)|"
                    r"(tag|label|target)s?.{0,80}argmax|(only|just) (the )?(first|one|a single|lowest)\w* (tag|label|class)")
def multilabel_tags_argmaxed_into_crossentropy(fixed=False):
    seed(0)
    x, tags = tagged_posts(1800, 14)
    model = mlp(N_WORDS, N_TAGS)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1400], tags[:1400]), 32),
                val_loader=loader(TensorDataset(x[1400:], tags[1400:]), 128, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else first_tag_ce, max_steps=1500)


def precision_at_true_count(model, kw):
    """Per post: the share of its k true tags among the model's k top-scored tags."""
    x, tags = tagged_posts(1800, 14)
    def score(m):
        scores = m(x[1400:])
        hits = []
        for s_, t in zip(scores, tags[1400:]):
            k = int(t.sum())
            hits.append(t[s_.topk(k).indices].mean().item())
        return sum(hits) / len(hits)
    return on_tensors(model, score)


fix("multilabel_tags_argmaxed_into_crossentropy", fixed_of(multilabel_tags_argmaxed_into_crossentropy),
    precision_at_true_count, "val precision@k (k = true tag count)", steps=300)


# --- pos_weight inverted ---------------------------------------------------------------------------------------

def fraud_table(n, s):
    """Card transactions: 8 features, about 8% fraud."""
    g = gen(s)
    x = torch.randn(n, 8, generator=g)
    score = 1.2 * x[:, 0] - x[:, 1] + 0.8 * x[:, 2] * x[:, 3] + 0.5 * torch.randn(n, generator=g)
    return x, (score > 2.6).float()


@case("pos_weight_inverted", "targets",
      bug="For an 8% positive (fraud) target, BCEWithLogitsLoss gets pos_weight = n_pos / n_neg (about 0.08) "
          "instead of n_neg / n_pos (about 12): the rare positives are down-weighted another twelvefold and the model "
          "settles on predicting 'not fraud' for everything.",
      cause_pattern=r"pos_weight\W.{0,100}(invert|revers|swap|below 1|< ?1\b|less than 1|n_pos ?/ ?n_neg|0\.0\d|"
                    r"down-?weight)|(positive|minority|rare|fraud)\w* (class )?(weight|examples?|samples?).{0,60}"
                    r"(down|less|small|below|invert|revers)|(invert|revers|swap)\w*.{0,60}(weight|ratio)|"
                    r"n_neg ?/ ?n_pos|num_neg\w* ?/ ?num_pos")
def pos_weight_inverted(fixed=False):
    seed(0)
    x, y = fraud_table(3000, 15)
    n_pos = y[:2400].sum()
    n_neg = 2400 - n_pos
    pos_weight = (n_neg / n_pos) if fixed else (n_pos / n_neg)
    model = mlp(8, 1, hidden=32)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:2400], y[:2400].unsqueeze(1)), 64),
                val_loader=loader(TensorDataset(x[2400:], y[2400:].unsqueeze(1)), 256, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pos_weight.reshape(1)), max_steps=1500)


def balanced_accuracy(model, kw):
    x, y = fraud_table(3000, 15)
    def score(m):
        pred = (m(x[2400:]).squeeze(1) > 0).float()
        yv = y[2400:]
        tpr = ((pred == 1) & (yv == 1)).sum() / yv.sum()
        tnr = ((pred == 0) & (yv == 0)).sum() / (1 - yv).sum()
        return ((tpr + tnr) / 2).item()
    return on_tensors(model, score)


fix("pos_weight_inverted", fixed_of(pos_weight_inverted), balanced_accuracy, "val balanced accuracy", steps=300)
