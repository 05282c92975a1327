"""Set bd's case registry: set a's Case / CaseTable and helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved), with the dense-prediction and
survival metrics both runs are scored on."""

from __future__ import annotations

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
    twin,
)
from benchmarks.blind_preflight_bd import synth

TABLE = CaseTable.by_family("benchmarks.blind_preflight_bd")
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix


def fixed_of(builder):
    return lambda: builder(fixed=True)


def _eval(model):
    was = model.training
    model.eval()
    return was


@torch.no_grad()
def miou_of(fwd, n_classes=3):
    """Validation mean IoU; fwd(model, batch) -> (logits (N, C, H, W), masks (N, H, W))."""
    def metric(model, kw):
        was = _eval(model)
        preds, masks = [], []
        for b in kw["val_loader"]:
            logits, m = fwd(model, b)
            preds.append(logits.float().argmax(1))
            masks.append(m)
        model.train(was)
        return synth.miou(torch.cat(preds), torch.cat(masks), n_classes)
    return metric


@torch.no_grad()
def iou_of(fwd):
    """Mean IoU of the predicted box with the true one; fwd(model, batch) -> (pred xyxy, true xyxy), same units."""
    def metric(model, kw):
        was = _eval(model)
        total = n = 0.0
        for b in kw["val_loader"]:
            p, y = fwd(model, b)
            total += synth.box_iou_xyxy(p.float(), y.float()).sum().item()
            n += y.shape[0]
        model.train(was)
        return total / n
    return metric


@torch.no_grad()
def pck_of(fwd, radius=3.0):
    """Fraction of points predicted within ``radius`` pixels; fwd(model, batch) -> (pred (.., 2), true (.., 2))."""
    def metric(model, kw):
        was = _eval(model)
        hit = n = 0.0
        for b in kw["val_loader"]:
            p, y = fwd(model, b)
            d = (p.float().reshape(-1, 2) - y.float().reshape(-1, 2)).norm(dim=1)
            hit += (d <= radius).sum().item()
            n += d.numel()
        model.train(was)
        return hit / n
    return metric


@torch.no_grad()
def cindex_of(fwd):
    """Harrell's C on the validation set; fwd(model, batch) -> (risk, time, event) (higher risk = earlier death)."""
    def metric(model, kw):
        was = _eval(model)
        rs, ts, es = [], [], []
        for b in kw["val_loader"]:
            r, tt, e = fwd(model, b)
            rs.append(r.float().reshape(-1))
            ts.append(tt.reshape(-1))
            es.append(e.reshape(-1))
        model.train(was)
        return synth.concordance(torch.cat(rs), torch.cat(ts), torch.cat(es))
    return metric
