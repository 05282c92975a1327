"""Set p's case registry: set a's Case / CaseTable and data helpers, its own case table, each broken case's one-line
fix, source URL and two hand-written paraphrases of a correct diagnosis (``META``), and the fixes ``verify.py`` trains
next to each broken case (``FIXES``: no preflight involved)."""

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
    token_sequences,
    twin,
)

TABLE = CaseTable.by_family("benchmarks.blind_preflight_p")
CASES, healthy, load_all = TABLE.cases, TABLE.healthy, TABLE.load_all

FIX_TABLE = FixTable()
FIXES, fix = FIX_TABLE.fixes, FIX_TABLE.fix

# name -> dict(fix=one-line fix, source=URL, paraphrases=[two correct diagnoses written by hand])
META: dict[str, dict] = {}


def case(name: str, family: str, bug: str, fix_line: str, source: str, cause_pattern: str,
         paraphrases: tuple[str, str]):
    """Register a broken case: set a's ``case`` plus its one-line fix, source and two paraphrases."""
    META[name] = dict(fix=fix_line, source=source, paraphrases=list(paraphrases))
    return TABLE.case(name, family, bug, cause_pattern)


def fixed_of(builder):
    return lambda: builder(fixed=True)


def rmse_of(fwd, loader_key: str = "val_loader"):
    """Validation RMSE with fwd(model, batch) -> (predictions, targets) of any matching numel."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            p, y = p.reshape(-1).float(), y.reshape(-1).float()
            return ((p - y) ** 2).sum().item(), y.numel()
        return math.sqrt(mean_over(model, kw[loader_key], fn))
    return metric


def acc_of(fwd, batches=None):
    """Validation accuracy with fwd(model, batch) -> (predicted labels, true labels); ``batches``: a function
    returning the batches to score on (default: the case's val_loader)."""
    def metric(model, kw):
        def fn(m, b):
            p, y = fwd(m, b)
            keep = y != -100
            return (p[keep] == y[keep]).sum().item(), keep.sum().item()
        return mean_over(model, batches() if batches else kw["val_loader"], fn)
    return metric


def split(x, y, n_train):
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def on(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """t on the device of ``like`` (inputs of forward)."""
    return t.to(like.device)
