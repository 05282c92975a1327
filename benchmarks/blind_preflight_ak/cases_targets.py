"""Set ak, family targets: what the loss is asked to match is not what the user means."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_ak.cases_shapes import TinyFCN
from benchmarks.blind_preflight_ak.registry import (
    acc_of,
    balanced_acc_of,
    case,
    fix,
    fixed_of,
    gen,
    loader,
    rmse_of,
    seed,
)

# --- 1. hand-written MSE: mean of the error, then squared -----------------------------------------------------------


def house_prices(n, d=10, s=0):
    g = gen(s)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g)
    y = x @ w / d ** 0.5 + 0.5 * torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=g)
    return x, y


def mlp(d_in, d_out, hidden=64):
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


@case("ak_mse_mean_then_square", "targets",
      "The hand-written regression loss is (pred - y).mean() ** 2, the square of the mean error, instead of "
      "((pred - y) ** 2).mean(); positive and negative errors cancel inside the mean, so any predictions whose errors "
      "average to zero give zero loss and the model only learns the batch mean of the target.",
      r"(\.mean\(\) ?\*\* ?2|square of the mean|mean\w* (error )?(then|before) (squar|the square)|"
      r"squar\w* after (the )?(mean|averag)|errors? cancel|cancel\w* out|\(\(pred - y\) ?\*\* ?2\)\.mean|"
      r"mean squared error .*(not|instead)|F\.mse_loss|nn\.MSELoss|sign\w* errors)")
def mse_mean_sq(fixed=False):
    seed(0)
    x, y = house_prices(1500, s=6)
    model = mlp(10, 1)

    def loss_fn(model, batch):
        xb, yb = batch
        err = model(xb).squeeze(-1) - yb
        return (err ** 2).mean() if fixed else err.mean() ** 2
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:1200], y[:1200]), 64),
                val_loader=loader(TensorDataset(x[1200:], y[1200:]), 300, shuffle=False),
                loss_fn=loss_fn, max_steps=1000)


fix("ak_mse_mean_then_square", fixed_of(mse_mean_sq), rmse_of(lambda m, b: (m(b[0]).squeeze(-1), b[1])),
    "val RMSE", higher=False)

# --- 2. label ids from pd.factorize run per shard ------------------------------------------------------------------

TOPICS = ["billing", "delivery", "refund", "account", "technical"]


class BagClassifier(nn.Module):
    def __init__(self, vocab=200, dim=32, classes=5):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.head(self.bag(tokens))


def tickets(n, s=0):
    """Support tickets: each topic has its own 30 keywords, 12 words a ticket (8 keywords, 4 shared words)."""
    g = gen(s)
    topic = torch.randint(0, 5, (n,), generator=g)
    kw = 50 + topic[:, None] * 30 + torch.randint(0, 30, (n, 8), generator=g)
    common = torch.randint(0, 50, (n, 4), generator=g)
    return torch.cat([kw, common], 1), [TOPICS[t] for t in topic.tolist()]


def factorize(names):
    """pd.factorize: ids by order of first appearance."""
    ids = {}
    return torch.tensor([ids.setdefault(t, len(ids)) for t in names])


@case("ak_labels_factorized_per_shard", "targets",
      "The ticket topics are turned into ids with pd.factorize (order of first appearance) separately for each of "
      "the four CSV shards, so 'refund' is class 0 in one shard and class 3 in another: the same text carries "
      "different integer labels across the training set.",
      r"(factoriz|LabelEncoder|label encod\w*|encod\w* (the )?labels? .*(per|each|separately)|per.?(shard|file|chunk)|"
      r"(each|every) (shard|file|chunk|split)|one (global )?(mapping|vocabulary|encoder)|class.?to.?(id|index) mapping|"
      r"(inconsistent|different) (label|class) (ids?|indices|mapping)|same (class|label) .*different (id|index|integer))")
def labels_per_shard(fixed=False):
    seed(0)
    x, names = tickets(2000, s=7)
    if fixed:
        y = torch.tensor([TOPICS.index(t) for t in names])
    else:
        g = gen(8)
        parts = []
        for k in range(4):                      # 4 shards of 400 rows, each factorized on its own
            sl = slice(400 * k, 400 * (k + 1))
            order = torch.randperm(400, generator=g)
            shard_names = [names[sl][i] for i in order.tolist()]
            ids = factorize(shard_names)
            parts.append(torch.empty(400, dtype=torch.long).scatter_(0, order, ids))
        parts.append(factorize(names[1600:]))   # the validation file
        y = torch.cat(parts)
    model = BagClassifier()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=5e-3),
                train_loader=loader(TensorDataset(x[:1600], y[:1600]), 32),
                val_loader=loader(TensorDataset(x[1600:], y[1600:]), 400, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(), max_steps=1000)


fix("ak_labels_factorized_per_shard", fixed_of(labels_per_shard),
    acc_of(lambda m, b: (m(b[0]).argmax(-1), b[1])), "val accuracy")

# --- 3. binary masks read as 0/255 into BCEWithLogitsLoss ------------------------------------------------------------


def cell_masks(n, size=16, s=0):
    g = gen(s)
    clean = F.avg_pool2d(torch.randn(n, 1, size + 4, size + 4, generator=g), 5, stride=1) * 2.5
    mask = (clean > 0.3).float()
    return clean + 0.6 * torch.randn(clean.shape, generator=g), mask


@case("ak_mask_0_255_bce", "targets",
      "The binary masks are read from PNG as uint8 0/255 and passed as .float() targets to BCEWithLogitsLoss without "
      "dividing by 255; BCE targets must lie in [0, 1], a 255 target weighs the foreground term 255x and makes the "
      "loss unbounded below, so the model marks almost every uncertain pixel as foreground.",
      r"(255|0 ?/ ?255|\[0, ?1\]|/ ?255|divid\w* by 255|binar\w* (the )?mask|"
      r"targets? (above|greater than|larger than) 1|mask .*(0 and 255|uint8)|probabilit\w* .*target)")
def mask_255(fixed=False):
    seed(0)
    x, m = cell_masks(800, s=9)
    m = m * (1.0 if fixed else 255.0)
    model = TinyFCN(classes=1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=2e-3),
                train_loader=loader(TensorDataset(x[:640], m[:640]), 32),
                val_loader=loader(TensorDataset(x[640:], m[640:]), 160, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=800)


fix("ak_mask_0_255_bce", fixed_of(mask_255), acc_of(lambda m, b: ((m(b[0]) > 0).long(), (b[1] > 0).long())),
    "val pixel accuracy")

# --- 4. teacher forcing without the shift ----------------------------------------------------------------------------

BOS, V = 10, 10


class RunningSumDecoder(nn.Module):
    """Decoder of a 'running total' transduction: y_t = (y_{t-1} + src_t) mod 10, teacher-forced."""

    def __init__(self, dim=48):
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(V, dim), nn.Embedding(V + 1, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, V)

    def forward(self, src, dec_in):
        h, _ = self.gru(self.src_emb(src) + self.tgt_emb(dec_in))
        return self.out(h)


def running_sum_data(n, T=8, s=0):
    src = torch.randint(0, V, (n, T), generator=gen(s))
    return src, src.cumsum(1) % V


def shift_right(tgt):
    return torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], 1)


@torch.no_grad()
def greedy_acc(model, kw):
    was = model.training
    model.eval()
    right = n = 0
    for src, tgt in kw["val_loader"]:
        dec = torch.full_like(src[:, :1], BOS)
        for t in range(src.size(1)):
            nxt = model(src[:, : t + 1], dec).argmax(-1)[:, -1:]
            dec = torch.cat([dec, nxt], 1)
        right += (dec[:, 1:] == tgt).sum().item()
        n += tgt.numel()
    model.train(was)
    return right / n


@case("ak_teacher_forcing_no_shift", "targets",
      "The decoder is teacher-forced with the target sequence itself as its input (dec_in = tgt) instead of the "
      "target shifted right behind a BOS token, so at step t it already sees y_t and learns to copy it; training loss "
      "falls to zero but greedy decoding, which only has its own previous outputs, produces garbage.",
      r"(shift\w* (right|the target|by one)|(un|not |without (the |a )?)shift\w*|BOS|start.?(of.?sequence )?token|decoder.?input\w* .*(same|equal|identical|target)|"
      r"dec_in ?= ?tgt|teacher.?forc\w*|(sees|see|seeing|leak\w*) .*(target|y_t|label|answer)|copy\w* (the )?"
      r"(target|input)|tgt\[:, ?:-1\]|(target|label)s? (used |fed )?as (the )?(decoder )?input)")
def no_shift(fixed=False):
    seed(0)
    src, tgt = running_sum_data(1500, s=10)
    model = RunningSumDecoder()

    def loss_fn(model, batch):
        s, t = batch
        dec_in = shift_right(t) if fixed else t
        return F.cross_entropy(model(s, dec_in).reshape(-1, V), t.reshape(-1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(src[:1200], tgt[:1200]), 32),
                val_loader=loader(TensorDataset(src[1200:], tgt[1200:]), 300, shuffle=False),
                loss_fn=loss_fn, max_steps=1500)


fix("ak_teacher_forcing_no_shift", fixed_of(no_shift), greedy_acc, "val greedy-decoding token accuracy")

# --- 5. pos_weight inverted --------------------------------------------------------------------------------------------


def fraud(n, d=12, s=0):
    g = gen(s)
    y = (torch.rand(n, generator=g) < 0.05).float()
    direction = torch.randn(d, generator=g)
    direction = direction / direction.norm()
    x = torch.randn(n, d, generator=g) + 1.6 * y[:, None] * direction
    return x, y


@case("ak_pos_weight_inverted", "targets",
      "For a 5%-positive fraud label the BCEWithLogitsLoss pos_weight is computed as n_pos / n_neg (about 0.05) "
      "instead of n_neg / n_pos (about 19): the rare positive class is down-weighted another 20x, and the model "
      "predicts 'not fraud' for everything.",
      r"(n_neg ?/ ?n_pos|n_pos ?/ ?n_neg|negatives? ?/ ?positives?|positives? ?/ ?negatives?|"
      r"pos_weight .*(invert|revers|flip|swap|wrong|upside|below 1|less than 1|< ?1|0\.0\d)|"
      r"(invert|revers|flip|swap)\w* .*(pos_weight|ratio)|(down.?weight|under.?weight)\w* .*(positive|minority|rare))")
def pos_weight(fixed=False):
    seed(0)
    x, y = fraud(4000, s=11)
    ytr = y[:3000]
    n_pos, n_neg = ytr.sum(), (1 - ytr).sum()
    pw = n_neg / n_pos if fixed else n_pos / n_neg
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                train_loader=loader(TensorDataset(x[:3000], ytr), 64),
                val_loader=loader(TensorDataset(x[3000:], y[3000:]), 500, shuffle=False),
                loss_fn=lambda m, b: F.binary_cross_entropy_with_logits(m(b[0]), b[1],
                                                                        pos_weight=pw.reshape(1).to(b[1].device)),
                max_steps=1000)


fix("ak_pos_weight_inverted", fixed_of(pos_weight),
    balanced_acc_of(lambda m, b: ((m(b[0]) > 0).long(), b[1].long())), "val balanced accuracy")
