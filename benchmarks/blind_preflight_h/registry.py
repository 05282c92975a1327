"""Set h's case registry: set a's Case / CaseTable and data helpers, its own case table, and the one-line fixes
``verify.py`` trains next to each broken case (``FIXES``: no preflight involved)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from benchmarks.blind_preflight.registry import (  # noqa: F401
    Case,
    CaseTable,
    loader,
    seed,
    teacher_classes,
    teacher_regression,
    token_sequences,
)

TABLE = CaseTable([f"benchmarks.blind_preflight_h.{name}" for name in (
    "cases_shapes", "cases_targets", "cases_trained", "cases_mechanics", "cases_data", "cases_healthy")])
CASES, case, healthy, load_all = TABLE.cases, TABLE.case, TABLE.healthy, TABLE.load_all

# name -> dict(fixed=builder of the fixed kwargs, metric=fn(model, kwargs) -> float, label=str, higher=bool,
#              fact=fn() printing the fact the bug rests on, steps=int)
FIXES: dict[str, dict[str, Any]] = {}


def fix(name: str, fixed: Callable[[], dict], metric: Callable, label: str, fact: Callable | None = None,
        steps: int = 300, higher: bool = True) -> None:
    FIXES[name] = dict(fixed=fixed, metric=metric, label=label, fact=fact, steps=steps, higher=higher)


@torch.no_grad()
def accuracy(model, batches, fwd=None) -> float:
    """fwd(model, batch) -> (predictions, targets); default: model(batch[0]).argmax(-1) vs batch[-1]."""
    was = model.training
    model.eval()
    right = n = 0
    for batch in batches:
        pred, y = fwd(model, batch) if fwd else (model(batch[0]).argmax(-1), batch[-1])
        keep = y != -100
        right += (pred[keep] == y[keep]).sum().item()
        n += keep.sum().item()
    model.train(was)
    return right / max(n, 1)


def val_acc(model, kw) -> float:
    return accuracy(model, kw["val_loader"])


def gen(s: int) -> torch.Generator:
    return torch.Generator().manual_seed(s)
