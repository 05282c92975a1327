"""Set af's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

import math

import torch

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
    teacher_regression,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_af")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def _to(batch, device):
    if isinstance(batch, dict):
        return {k: v.to(device) for k, v in batch.items()}
    return [b.to(device) for b in batch]


@torch.no_grad()
def collect(model, batches, fwd):
    """Concatenated fwd(model, batch) -> (predictions, targets) over the batches, the model in eval mode."""
    was = model.training
    model.eval()
    dev = model_device(model)
    ps, ys = [], []
    for b in batches:
        p, y = fwd(model, _to(b, dev))
        ps.append(p.detach().float().cpu())
        ys.append(y.detach().cpu())
    model.train(was)
    return torch.cat(ps), torch.cat(ys)


def acc_of(fwd, val=None):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); ``val(kw)``: another loader."""
    def metric(model, kw):
        p, y = collect(model, val(kw) if val else kw["val_loader"], fwd)
        p, y = p.reshape(-1), y.reshape(-1)
        keep = y != -100
        return (p[keep] == y[keep].float()).float().mean().item()
    return metric


def rmse_of(fwd):
    def metric(model, kw):
        p, y = collect(model, kw["val_loader"], fwd)
        return math.sqrt(((p.reshape(-1) - y.reshape(-1).float()) ** 2).mean().item())
    return metric


def balanced_acc_of(fwd):
    def metric(model, kw):
        p, y = collect(model, kw["val_loader"], fwd)
        p, y = p.reshape(-1), y.reshape(-1).long()
        recalls = [(p[y == c] == c).float().mean().item() for c in (0, 1)]
        return sum(recalls) / 2
    return metric


def cindex(risk, time, event):
    """Harrell's C: over pairs with time_i < time_j and an event at i, the share where risk_i > risk_j."""
    valid = (time[:, None] < time[None, :]) & (event[:, None] > 0)
    conc = (risk[:, None] > risk[None, :]).float() + 0.5 * (risk[:, None] == risk[None, :]).float()
    return ((conc * valid).sum() / valid.sum()).item()


def cindex_of(fwd):
    """fwd(model, batch) -> (risk, stack([time, event], 1)) with the TRUE event indicator."""
    def metric(model, kw):
        r, te = collect(model, kw["val_loader"], fwd)
        return cindex(r.reshape(-1), te[:, 0], te[:, 1])
    return metric
