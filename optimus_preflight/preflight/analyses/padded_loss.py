"""O15 from what ``LossSpy`` saw: padding the criterion trains on.

Given the batch's sequence shapes (``padding.py``), class targets are viewed as rows and
searched for edge runs of a pad id; with ``reduction='none'`` the sums over all and over
unpadded positions tell which one the returned loss divides; an attention mask that
disagrees with the loss mask is named in its own words.
"""

from __future__ import annotations

from typing import Any

import torch

from optimus_preflight.preflight.analyses.loss_findings import Finding, close
from optimus_preflight.preflight.analyses.loss_spy import CLASS_CRITERIA, CriterionCall
from optimus_preflight.preflight.analyses.padding import (
    MIN_SHARE,
    mask_disagreement,
)


def _pad_fix(pad: int | None, ignore_index: int | None) -> tuple[str, str]:
    which = f"id {pad}" if pad is not None else "the pad id"
    ignore = ignore_index if ignore_index is not None else -100
    fix = (f"Mark padding in the targets with {ignore} (the criterion's ignore_index), from the attention mask "
           "(labels[attention_mask == 0] = -100; Hugging Face's DataCollatorForLanguageModeling and "
           f"DataCollatorForSeq2Seq do this), or pass ignore_index={which.removeprefix('id ')} to cross_entropy / "
           "CrossEntropyLoss when that id is never a real target (GPT-2 pads with its EOS, which is). With "
           "reduction='none', multiply by the mask and divide by mask.sum(), not by the number of positions.")
    code_fix = (f"In your compute_loss (or the collate_fn that builds the targets), set the targets at padding "
                f"positions to {ignore} (targets[attention_mask == 0] = {ignore}), or compute "
                "(per_token * mask).sum() / mask.sum() from reduction='none'.")
    return fix, code_fix


def padded_loss_findings(calls: list[CriterionCall], returned: float | None, batch: Any) -> list[Finding]:
    """O15: a class criterion whose targets include padding that it does not ignore, so
    a mean runs over padding (diluted, length-dependent) and the model learns to
    predict padding. At most one finding: the attention mask's word when it has one."""
    for call in calls:
        if call.function not in CLASS_CRITERIA or call.reduction == "none" or call.ignore_index is None:
            continue
        # The batch's labels reach this criterion (a Hugging Face model given labels=).
        disagreement = mask_disagreement(batch, call.ignore_index)
        if disagreement is None or not disagreement.positions or call.target_numel != _labels_numel(batch):
            continue
        share = disagreement.positions / max(disagreement.targets, 1)
        fix, code_fix = _pad_fix(disagreement.value, call.ignore_index)
        return [Finding(
            "O15", "warning",
            f"{disagreement.positions} label(s) where attention_mask is 0 (padding) are not {call.ignore_index}, "
            f"the ignore_index of {call.function} ({share:.0%} of the targets it trains on): the loss "
            + _trains_on_padding(call.reduction),
            fix, code_fix,
        )]
    for call in calls:
        profile = call.padding
        if profile is None:
            found = _ignored_averaged_in(call, returned)
            if found is not None:
                return [found]
            continue
        where = (f"id {profile.value} fills the {profile.side} of {profile.padded_rows} of {profile.rows} target "
                 f"rows ({profile.positions} positions, {profile.share:.0%} of the targets) and {call.function}'s "
                 f"ignore_index is {call.ignore_index}")
        fix, code_fix = _pad_fix(profile.value, call.ignore_index)
        if call.reduction != "none":
            return [Finding("O15", "warning", f"{call.function} trains on padding: {where}, so the loss "
                            + _trains_on_padding(call.reduction), fix, code_fix)]
        sums = call.sums
        if sums is None or returned is None:
            continue
        if close(returned, sums.unpadded / max(sums.unpadded_targets, 1)):
            continue  # masked and divided by the real targets: correct
        if any(close(returned, sums.total / n) for n in (sums.positions, sums.targets)):
            return [Finding("O15", "warning", f"{call.function}(reduction='none') is averaged over padding: {where}; "
                            "the returned loss is the mean over every position, so it " + _trains_on_padding("mean"),
                            fix, code_fix)]
        padded = sums.targets - sums.unpadded_targets  # padding positions that are not ignored
        if padded > 0 and close(returned, (sums.total - sums.unpadded) / padded):
            return [Finding(
                "LOSS_MASK_INVERTED", "error",
                f"the loss trains on the padding only: {where}, and the returned loss is the mean of "
                f"{call.function}(reduction='none') over exactly those {padded} padding positions, not over the "
                f"{sums.unpadded_targets} real ones. The mask is inverted (mask = ids == pad_id, or attention_mask == 0, "
                "where != was meant): every real token gets weight 0, and the model learns only to predict padding",
                "Build the mask from the real positions: mask = (ids != pad_id).float() (or attention_mask == 1), "
                "then loss = (per_token * mask).sum() / mask.sum().",
                "In your compute_loss, flip the mask: keep = (ids != pad_id); loss = (per_token * keep).sum() / keep.sum().",
            )]
        divisor = next((n for n in (sums.positions, sums.targets) if close(returned, sums.unpadded / n)), None)
        if divisor is not None:
            return [Finding("O15", "warning", f"the padding is masked out of the loss but the masked sum is divided by "
                            f"{divisor} positions instead of the {sums.unpadded_targets} real targets ({where}): the "
                            "loss, and the gradient with it, shrinks with how much padding a batch holds", fix, code_fix)]
    return []


def _ignored_averaged_in(call: CriterionCall, returned: float | None) -> Finding | None:
    """``reduction='none'`` with ignore_index, then ``.mean()``: ignored positions give 0
    and still count in the denominator (pytorch#63004), diluting the loss by their share."""
    sums = call.sums
    if sums is None or returned is None or sums.targets > (1 - MIN_SHARE) * sums.positions:
        return None
    if not close(returned, sums.total / sums.positions) or close(returned, sums.total / max(sums.targets, 1)):
        return None
    return Finding(
        "O15", "warning",
        f"{call.function}(reduction='none') gives 0 at the {sums.positions - sums.targets} ignored positions "
        f"(ignore_index={call.ignore_index}) and the returned loss is the mean over all {sums.positions} positions, "
        f"not over the {sums.targets} real targets: it is diluted by the ignored share "
        f"({1 - sums.targets / sums.positions:.0%}) and changes with how much padding a batch holds",
        "Divide the sum by the number of non-ignored targets: loss = per_target.sum() / (targets != "
        f"{call.ignore_index}).sum(), or use reduction='mean', which does exactly that.",
        f"In your compute_loss, replace per_target.mean() by per_target.sum() / (targets != {call.ignore_index}).sum().",
    )


def _trains_on_padding(reduction: str) -> str:
    if reduction == "sum":
        return ("sums padding in: the model is trained to predict padding, and the loss grows with how much "
                "padding a batch holds")
    return ("averages padding in: it is diluted by the padding share and changes with how much padding a batch "
            "holds (batch size, max length), the gradient on real tokens shrinks with it, and the model is "
            "trained to predict padding")


def _labels_numel(batch: Any) -> int | None:
    labels = batch.get("labels") if hasattr(batch, "get") else None
    return labels.numel() if isinstance(labels, torch.Tensor) else None
