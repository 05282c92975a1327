"""Set au's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved). Focus: distillation,
semi-supervised learning, class imbalance, ordinal and multi-label heads."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.blind_preflight.fixes import FixTable, accuracy, val_acc  # noqa: F401
from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    gen,
    loader,
    mean_over,
    model_device,
    seed,
    teacher_classes,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_au")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def mlp(d_in, d_out, hidden=64, depth=2):
    layers, d = [], d_in
    for _ in range(depth - 1):
        layers += [nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    layers.append(nn.Linear(d, d_out))
    return nn.Sequential(*layers)


def blobs(n, d, probs, sep=1.0, s=0):
    """Gaussian classes with prior ``probs`` (imbalanced when uneven); ``sep`` scales the class means."""
    g = gen(s)
    c = len(probs)
    means = torch.randn(c, d, generator=g) * sep
    y = torch.multinomial(torch.tensor(probs, dtype=torch.float), n, replacement=True, generator=g)
    x = means[y] + torch.randn(n, d, generator=g)
    return x, y


def oracle_teacher(d, c, s=0, scale=3.0):
    """A 'pretrained' teacher: a fixed linear map whose argmax defines the task (``teacher_classes``-style)."""
    g = gen(s)
    t = nn.Linear(d, c)
    with torch.no_grad():
        t.weight.copy_(torch.randn(c, d, generator=g) * scale / d ** 0.5)
        t.bias.zero_()
    return t


@torch.no_grad()
def balanced_acc(model, kw, fwd=None):
    """Mean per-class recall on the validation loader; fwd(model, batch) -> (pred labels, true labels)."""
    was = model.training
    model.eval()
    preds, ys = [], []
    for b in kw["val_loader"]:
        p, y = fwd(model, b) if fwd else (model(b[0]).argmax(-1), b[-1])
        preds.append(p.reshape(-1))
        ys.append(y.reshape(-1))
    model.train(was)
    p, y = torch.cat(preds), torch.cat(ys)
    recalls = [(p[y == k] == k).float().mean().item() for k in y.unique()]
    return sum(recalls) / len(recalls)


def binary_balanced_acc(model, kw):
    return balanced_acc(model, kw, lambda m, b: ((m(b[0]).reshape(-1) > 0).long(), b[-1].reshape(-1).long()))
