"""Missing labels filled with 0 in training only (``data.split_missing``).

``LABELS_MISSING_FILLED``: multi-task or multi-label targets where most entries were never
measured. Validation keeps them as NaN (and the loss masks NaN out), while the training
targets hold no NaN at all and far more zeros than validation's measured entries: the
missing labels were filled with 0 (``fillna(0)``, ``nan_to_num``) and every unmeasured entry
is taught as a confirmed negative.

The same with a mask of observed entries beside the targets (``(x, y, mask)`` batches, the mask
0/1 and shaped like ``y``): validation's mask marks entries missing while training's marks every
entry observed and training's targets hold the zeros: the mask was computed after the fill
(``~torch.isnan(y)`` on the ``nan_to_num`` output), so the loss's masking keeps every filled 0.

Read from up to 1024 samples of each split: float targets ``(B, k)``; validation's share of
missing entries (NaN, or 0 in the mask) is 10% or more, training's is 0, and training's share of
zeros exceeds validation's share of zeros among the measured entries by at least half of what
filling the missing share with 0 adds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES, BUDGET_S = 1024, 2.0
MISSING = 0.1  # share of validation entries that are NaN


def float_targets(batch: Any) -> torch.Tensor | None:
    """(B, k, 2): the float targets (the last element of a tuple batch, or the one before a 0/1 mask
    of the same shape) and, beside each, 1 where it is missing (NaN, or 0 in that mask)."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return None
    target, mask = batch[-1], None
    if len(batch) >= 3 and isinstance(batch[-2], torch.Tensor) and isinstance(target, torch.Tensor) \
            and batch[-2].shape == target.shape and batch[-2].is_floating_point() and is_mask(target):
        target, mask = batch[-2], target
    if not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.dim() not in (1, 2):
        return None
    values = target.detach().reshape(len(target), -1).float().cpu()
    missing = torch.isnan(values) if mask is None else mask.detach().reshape(len(target), -1).cpu() == 0
    return torch.stack([values, missing.float()], dim=-1)


def is_mask(tensor: torch.Tensor) -> bool:
    values = tensor.detach()
    return values.dtype == torch.bool or bool(((values == 0) | (values == 1)).all())


def filled_share(train: torch.Tensor, val: torch.Tensor) -> tuple[float, float, float] | None:
    """(validation's missing share, training's zero share, validation's zero share among measured
    entries) when training's missing entries look filled with 0 (pure)."""
    if train.shape[1] != val.shape[1] or not val.numel() or not train.numel():
        return None
    val_missing = val[..., 1] > 0
    missing = float(val_missing.float().mean())
    if missing < MISSING or bool((train[..., 1] > 0).any()) or bool(torch.isnan(train[..., 0]).any()):
        return None
    measured = val[..., 0][~val_missing]
    if not measured.numel():
        return None
    train_zero, val_zero = float((train[..., 0] == 0).float().mean()), float((measured == 0).float().mean())
    # Filled with 0, training's zeros are the missing share plus the measured zeros: an excess of
    # missing * (1 - val_zero). Half of it is required.
    if train_zero - val_zero < 0.5 * missing * (1 - val_zero):
        return None
    return missing, train_zero, val_zero


class SplitMissingCheck(Check):
    """LABELS_MISSING_FILLED: missing labels kept as NaN in validation, filled with 0 in training."""

    name = "data.split_missing"
    stage = Stage.DATA
    codes = ("LABELS_MISSING_FILLED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if ctx.val_loader is None or float_targets(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "no validation loader, or no float targets"
            return
        read = {}
        for split, loader in (("training", ctx.train_loader), ("validation", ctx.val_loader)):
            parts = read_samples(ctx, self.name, findings, loader, f"{split} targets for {self.name}", float_targets,
                                 SAMPLES, BUDGET_S)
            if not parts or len({p.shape[1] for p in parts}) != 1:
                return
            read[split] = torch.cat(parts)
        found = filled_share(read["training"], read["validation"])
        findings.data["summary"] = "missing labels filled in training" if found else "no filled labels"
        if found is None:
            return
        missing, train_zero, val_zero = found
        if bool(torch.isnan(read["validation"][..., 0][read["validation"][..., 1] > 0]).all()):
            self.warn_filled(findings, missing, train_zero, val_zero)
        else:
            self.warn_mask_after_fill(findings, missing, train_zero, val_zero)

    @staticmethod
    def warn_filled(findings: Findings, missing: float, train_zero: float, val_zero: float) -> None:
        findings.warning(
            "LABELS_MISSING_FILLED",
            f"{missing:.0%} of the validation targets are missing (NaN), but the training targets hold no NaN and "
            f"{train_zero:.0%} zeros, against {val_zero:.0%} zeros among the measured validation targets: the "
            "missing training labels were filled with 0 (fillna(0), nan_to_num), so every unmeasured entry is "
            "taught as a confirmed negative and the model learns that positives are rare",
            "Keep the missing labels as NaN and mask them out of the loss: known = ~torch.isnan(y); "
            "loss = F.binary_cross_entropy_with_logits(logits[known], y[known]).",
            "data.train",
        )

    @staticmethod
    def warn_mask_after_fill(findings: Findings, missing: float, train_zero: float, val_zero: float) -> None:
        findings.warning(
            "LABELS_MISSING_FILLED",
            f"the mask beside the targets marks {missing:.0%} of the validation targets missing, but every training "
            f"target observed, while the training targets hold {train_zero:.0%} zeros against {val_zero:.0%} among "
            "the measured validation targets: the training mask was computed after the missing labels were filled "
            "(~torch.isnan(y) taken on the nan_to_num / fillna(0) output, where no NaN is left), so the mask is all "
            "ones and every missing training label is taught as a measured 0",
            "Take the mask before the fill: observed = ~torch.isnan(y_raw); y = torch.nan_to_num(y_raw); then "
            "loss = ((pred - y) ** 2 * observed).sum() / observed.sum().",
            "data.train",
        )
