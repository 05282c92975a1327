"""Targets: class weights, pos_weight, multi-label and ordinal encodings, threshold-derived labels."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks.blind_preflight_au.registry import (
    FIX_TABLE,
    balanced_acc,
    binary_balanced_acc,
    blobs,
    case,
    fixed_of,
    gen,
    loader,
    mlp,
    seed,
)


# 1. class weights taken from Counter(...).values(): first-appearance order, not class order
@case("class_weights_counter_order", "targets",
      "The CrossEntropyLoss class weights are built from Counter(labels).values(), which follows the order classes "
      "first appear in the (severity-sorted) data, so weight[k] belongs to another class and the rare class gets "
      "the smallest weight.",
      r"Counter|first appear|insertion order|(weight|weights).*(order|misalign|wrong class|index)|"
      r"(order|misalign).*weight|sorted\(|bincount|per-class weight.*class index")
def class_weights_counter_order(fixed=False):
    seed(10)
    x, y = blobs(4000, 8, [0.8, 0.15, 0.05], sep=0.6, s=11)
    xt, yt, xv, yv = x[:3200], y[:3200], x[3200:], y[3200:]
    order = torch.argsort(yt, descending=True, stable=True)     # training export sorted by severity, most severe first
    xt, yt = xt[order], yt[order]
    counts = Counter(yt.tolist())
    if fixed:
        freq = torch.tensor([counts[k] for k in range(3)], dtype=torch.float)
    else:
        freq = torch.tensor(list(counts.values()), dtype=torch.float)
    weights = freq.sum() / (3 * freq)
    model = mlp(8, 3)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(xt, yt), 64),
                val_loader=loader(TensorDataset(xv, yv), 200, shuffle=False),
                loss_fn=nn.CrossEntropyLoss(weight=weights), max_steps=300)


FIX_TABLE.fix("class_weights_counter_order", fixed_of(class_weights_counter_order), balanced_acc,
              "val balanced acc")


# 2. pos_weight inverted: n_pos / n_neg instead of n_neg / n_pos
@case("pos_weight_inverted", "targets",
      "BCEWithLogitsLoss gets pos_weight = n_pos / n_neg (about 0.05) instead of n_neg / n_pos, so the rare "
      "positives are down-weighted twentyfold instead of up-weighted and the model predicts negative.",
      r"pos_weight.*(invert|revers|n_neg|neg\w* / ?pos|num_neg|<\s*1|below 1|less than 1|too small)|"
      r"(invert|revers|swap).*pos_weight|negatives? (over|divided)")
def pos_weight_inverted(fixed=False):
    seed(13)
    x, y = blobs(5000, 10, [0.95, 0.05], sep=0.55, s=14)
    y = y.float().unsqueeze(1)
    n_pos = y[:4000].sum()
    n_neg = 4000 - n_pos
    pw = n_neg / n_pos if fixed else n_pos / n_neg
    model = mlp(10, 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:4000], y[:4000]), 64),
                val_loader=loader(TensorDataset(x[4000:], y[4000:]), 250, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(pos_weight=pw.reshape(1)), max_steps=300)


FIX_TABLE.fix("pos_weight_inverted", fixed_of(pos_weight_inverted), binary_balanced_acc, "val balanced acc")


# 3. multi-hot targets into CrossEntropyLoss (soft-label softmax) for a sigmoid-thresholded multi-label head
@case("multilabel_with_crossentropy", "targets",
      "Multi-hot float targets are fed to nn.CrossEntropyLoss, which treats them as class probabilities under one "
      "softmax, so the logits never learn per-label sigmoid decisions; the multi-label head needs "
      "BCEWithLogitsLoss.",
      r"CrossEntropy.*(multi-?label|multi-?hot)|(multi-?label|multi-?hot).*(CrossEntropy|BCEWithLogits|sigmoid)|"
      r"softmax.*(mutually exclusive|one class)|class probabilit")
def multilabel_with_crossentropy(fixed=False):
    seed(15)
    g = gen(16)
    x = torch.randn(2400, 16, generator=g)
    w = torch.randn(16, 6, generator=g)
    y = (x @ w > torch.linspace(-2, 1.5, 6)).float()
    model = mlp(16, 6)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss() if fixed else nn.CrossEntropyLoss(), max_steps=300)


@torch.no_grad()
def multilabel_acc(model, kw):
    model.eval()
    r = n = 0
    for xb, yb in kw["val_loader"]:
        r += ((model(xb) > 0).float() == yb).all(1).sum().item()
        n += len(yb)
    model.train()
    return r / n


FIX_TABLE.fix("multilabel_with_crossentropy", fixed_of(multilabel_with_crossentropy), multilabel_acc,
              "val exact-match acc")


# 4. CORAL cumulative targets built with >= instead of >
K = 5


def coral_levels(y, fixed):
    ks = torch.arange(K - 1, device=y.device)
    return (y.unsqueeze(1) > ks).float() if fixed else (y.unsqueeze(1) >= ks).float()


@case("coral_levels_off_by_one", "targets",
      "The CORAL / cumulative-link targets are built as y >= k for k in 0..K-2 instead of y > k, so the first "
      "binary task is always 1 and every decoded grade comes out one rank too high.",
      r">=|>\s*k|off[- ]by[- ]one|one rank|shifted|always (1|one|positive)|first (level|threshold|task)|"
      r"cumulative (target|label|level)")
def coral_levels_off_by_one(fixed=False):
    seed(17)
    g = gen(18)
    x = torch.randn(2400, 10, generator=g)
    w = torch.randn(10, generator=g)
    y = torch.bucketize(x @ w / 10 ** 0.5, torch.tensor([-1.0, -0.3, 0.3, 1.0]))
    model = mlp(10, K - 1)

    def coral_loss(model, batch):
        xb, yb = batch
        return F.binary_cross_entropy_with_logits(model(xb), coral_levels(yb, fixed))

    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2000], y[:2000]), 64),
                val_loader=loader(TensorDataset(x[2000:], y[2000:]), 200, shuffle=False),
                loss_fn=coral_loss, max_steps=300)



@torch.no_grad()
def _coral_plain(model, kw):
    model.eval()
    r = n = 0
    for xb, yb in kw["val_loader"]:
        r += ((model(xb) > 0).sum(1) == yb).sum().item()
        n += yb.numel()
    model.train()
    return r / n


FIX_TABLE.fix("coral_levels_off_by_one", fixed_of(coral_levels_off_by_one), _coral_plain, "val grade acc")


# 5. clinical label thresholded after z-scoring the column
@case("threshold_on_standardized_column", "targets",
      "The diagnosis label is derived as hba1c > 6.5 after the hba1c column was already z-scored, so the clinical "
      "cut-off in percent is applied to standard-score units and every label is negative.",
      r"(threshold|cut-?off|>\s*6\.5).*(standardi|z-?scor|normali|scaled)|"
      r"(standardi[sz]|z-?scor|normali[sz])\w*.*(before|then|prior to).*(threshold|label|cut-?off)|"
      r"clinical (cut-?off|threshold)|standard-score units")
def threshold_on_standardized_column(fixed=False):
    seed(19)
    g = gen(20)
    feats = torch.randn(3000, 9, generator=g)
    hba1c = 5.8 + 0.9 * (feats[:, :4].sum(1) / 2) + 0.2 * torch.randn(3000, generator=g)
    label_true = (hba1c > 6.5).float()
    table = torch.cat([feats, hba1c.unsqueeze(1)], 1)
    table_z = (table - table.mean(0)) / table.std(0)
    label = label_true if fixed else (table_z[:, -1] > 6.5).float()
    x = table_z[:, :9]                                              # hba1c itself is not an input
    model = mlp(9, 1)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), 3e-3),
                train_loader=loader(TensorDataset(x[:2400], label[:2400].unsqueeze(1)), 64),
                val_loader=loader(TensorDataset(x[2400:], label_true[2400:].unsqueeze(1)), 200, shuffle=False),
                loss_fn=nn.BCEWithLogitsLoss(), max_steps=300)


FIX_TABLE.fix("threshold_on_standardized_column", fixed_of(threshold_on_standardized_column), binary_balanced_acc,
              "val balanced acc")
