"""Ordinal class codes that do not follow the order the inputs rank them in (``step.ordinal_codes``).

An ordinal loss (CORAL, cumulative-link: ``P(y > k) = sigmoid(score - t_k)``, trained with
BCE on the cumulative targets ``y > k``) assumes the class codes follow the grades' order.
Codes from ``LabelEncoder`` or ``sorted(set(names))`` follow the names' alphabetical order
instead ("high" < "low" < "medium" < "very high"): the cumulative targets then describe an
order no single score can fit, and the model learns a compromise.

Read from the step and the data: the loss's BCE target is cumulative (each row ones then
zeros) and so names an ordinal loss; over the training samples, a linear score of the inputs
fits the codes as given far worse than the same codes relabelled in another order (not the
reverse, which an ordinal model fits as well).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.split_labels import features_and_labels
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_CLASSES = 7  # permutations tried: 5,040 at most
SAMPLES = 2048
MIN_SAMPLES = 200
BUDGET_S = 2.0
FITS = 0.3  # R^2 of the best order, at least
WORSE = 0.6  # the codes as given fit at most this share of the best order's R^2


class CumulativeTarget(TorchFunctionMode):
    """Whether a BCE in the step gets cumulative 0/1 targets (rows of ones, then zeros)."""

    def __init__(self) -> None:
        super().__init__()
        self.levels = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("binary_cross_entropy_with_logits", "binary_cross_entropy") \
                and not self.levels and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            target = args[1].detach()
            if target.dim() == 2 and target.shape[1] >= 2 and bool(((target == 0) | (target == 1)).all()) \
                    and bool((target[:, 1:] <= target[:, :-1]).all()) and target.sum(1).unique().numel() >= 3:
                self.levels = int(target.shape[1])
        return func(*args, **kwargs)


def order_fit(x: torch.Tensor, codes: torch.Tensor, classes: int) -> tuple[float, float, tuple[int, ...]]:
    """(R^2 of a least-squares linear score fitted to the codes as given, the best R^2 over the
    codes relabelled, that relabelling as new code per old code) (pure)."""
    design = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    projector = torch.linalg.pinv(design)

    def r2(values: torch.Tensor) -> float:
        fitted = design @ (projector @ values)
        residual = float(((values - fitted) ** 2).sum())
        total = float(((values - values.mean()) ** 2).sum())
        return 1.0 - residual / total if total else 0.0

    given = r2(codes.double())
    best, best_order = given, tuple(range(classes))
    for order in itertools.permutations(range(classes)):
        if order == tuple(range(classes)) or order == tuple(reversed(range(classes))):
            continue
        value = r2(torch.tensor(order, dtype=torch.float64)[codes])
        if value > best:
            best, best_order = value, order
    return given, best, best_order


class OrdinalCodesCheck(Check):
    """ORDINAL_CODES_UNORDERED: an ordinal loss over codes that do not follow the inputs' order."""

    name = "step.ordinal_codes"
    stage = Stage.STEP
    codes = ("ORDINAL_CODES_UNORDERED",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if features_and_labels(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "not an (inputs, labels) batch"
            return
        watch = CumulativeTarget()
        try:
            with watch:
                eval_forward(ctx, move_to_device(ctx.artifacts.first_batch, ctx.device))
        except Exception:
            findings.data["summary"] = "the loss could not be observed"
            return
        classes = watch.levels + 1
        if not watch.levels or classes > MAX_CLASSES:
            findings.data["summary"] = "no cumulative (ordinal) targets"
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, "training samples", features_and_labels, SAMPLES,
                             BUDGET_S)
        if not parts:
            return
        x, codes = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]).long()
        if len(codes) < MIN_SAMPLES or int(codes.min()) < 0 or int(codes.max()) >= classes \
                or x.shape[1] >= len(codes) // 4:
            findings.data["summary"] = "too few samples for the inputs' width"
            return
        given, best, order = order_fit(x, codes, classes)
        findings.data.update(r2_as_given=round(given, 4), r2_best_order=round(best, 4), best_order=list(order))
        findings.data["summary"] = f"a linear score fits the codes with R^2 {given:.2f}, {best:.2f} in the best order"
        if best < FITS or given > WORSE * best:
            return
        ranked = sorted(range(classes), key=lambda code: order[code])
        ranked = ranked if ranked[0] < ranked[-1] else ranked[::-1]  # an order and its reverse fit alike
        findings.warning(
            "ORDINAL_CODES_UNORDERED",
            f"the ordinal loss (cumulative targets y > k over {classes} classes) gets class codes that do not follow "
            f"the order the inputs rank them in: a linear score of the inputs fits the codes as given with R^2 "
            f"{given:.2f}, but {best:.2f} once they are read in the order {' < '.join(str(c) for c in ranked)}. "
            "The codes follow another order than the grades': ordinal labels encoded alphabetically (LabelEncoder "
            "and sorted(set(names)) sort the names as strings: 'high' < 'low' < 'medium' < 'very high'), so the "
            "cumulative targets describe an order no single score can fit",
            "Encode the grades in their own order: OrdinalEncoder(categories=[['low', 'medium', 'high', 'very high']]) "
            "or a dict {name: rank} written out, never LabelEncoder or sorted(set(names)) for ordinal labels.",
            "data.train",
        )
