"""Missing labels filled with 0 in training only (``data.split_missing``).

``LABELS_MISSING_FILLED``: multi-task or multi-label targets where most entries were never
measured. Validation keeps them as NaN (and the loss masks NaN out), while the training
targets hold no NaN at all and far more zeros than validation's measured entries: the
missing labels were filled with 0 (``fillna(0)``, ``nan_to_num``) and every unmeasured entry
is taught as a confirmed negative.

Read from up to 1024 samples of each split: float targets ``(B, k)``; validation's share of NaN
is 10% or more, training's is 0, and training's share of zeros exceeds validation's share of
zeros among the measured entries by at least half of what filling the missing share with 0 adds.
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
    """The (B, k) float targets, the last element of a tuple batch."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return None
    target = batch[-1]
    if not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.dim() not in (1, 2):
        return None
    return target.detach().reshape(len(target), -1).float().cpu()


def filled_share(train: torch.Tensor, val: torch.Tensor) -> tuple[float, float, float] | None:
    """(validation's NaN share, training's zero share, validation's zero share among measured
    entries) when training's missing entries look filled with 0 (pure)."""
    if train.shape[1] != val.shape[1] or not val.numel() or not train.numel():
        return None
    missing = float(torch.isnan(val).float().mean())
    if missing < MISSING or bool(torch.isnan(train).any()):
        return None
    measured = val[~torch.isnan(val)]
    if not measured.numel():
        return None
    train_zero, val_zero = float((train == 0).float().mean()), float((measured == 0).float().mean())
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
