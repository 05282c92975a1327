"""Labels masked by the pad id where the pad id is also a real token (``data.label_masking``).

``tokenizer.pad_token = tokenizer.eos_token`` is the usual recipe for GPT-2 style models.
Masking the labels with ``labels[input_ids == pad_token_id] = -100`` then removes every
real EOS from the targets too, not only the padding: the model is never trained to end a
sequence, and generation never stops. Masking by ``attention_mask == 0`` keeps them.

Read from a Hugging Face style batch: attended positions (``attention_mask == 1``) whose
label is ignored, every one of them holding the id that fills the padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

IGNORE = -100
MIN_ROWS_HIT = 0.5  # of the rows that have padding: each loses its real end token


class LabelMaskingCheck(Check):
    """LABELS_MASK_REAL_TOKEN: the pad id is a real token the label mask removes."""

    name = "data.label_masking"
    stage = Stage.DATA
    codes = ("LABELS_MASK_REAL_TOKEN",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        if not isinstance(batch, Mapping):
            findings.data["summary"] = "not a mapping batch"
            return
        ids, mask, labels = (batch.get(key) for key in ("input_ids", "attention_mask", "labels"))
        if not all(isinstance(t, torch.Tensor) for t in (ids, mask, labels)) or not ids.shape == mask.shape == labels.shape:
            findings.data["summary"] = "no input_ids, attention_mask and labels of one shape"
            return
        padding = mask == 0
        if not bool(padding.any()):
            findings.data["summary"] = "no padding"
            return
        pad_id = int(torch.mode(ids[padding]).values)
        masked_real = (mask == 1) & (labels == IGNORE)
        if not bool(masked_real.any()) or not bool((ids[masked_real] == pad_id).all()):
            findings.data["summary"] = "the label mask follows the padding"
            return
        padded_rows = padding.any(dim=1)
        hit = (masked_real.any(dim=1) & padded_rows).sum()
        findings.data["summary"] = f"{int(masked_real.sum())} attended token(s) of id {pad_id} have no label"
        if int(hit) < MIN_ROWS_HIT * int(padded_rows.sum()):
            return
        findings.warning(
            "LABELS_MASK_REAL_TOKEN",
            f"the labels ignore the attended tokens of id {pad_id} in {int(hit)} of {int(padded_rows.sum())} padded "
            f"rows: id {pad_id} is the padding id and also a real token the sequences contain (the EOS, when "
            "tokenizer.pad_token = tokenizer.eos_token), so masking the labels by input_ids == pad_token_id removes "
            "every real end-of-sequence from the targets: the model never learns to stop",
            "Mask the labels by the attention mask: labels[attention_mask == 0] = -100 (the DataCollator for "
            "language modelling does this), or give the tokenizer its own pad token.",
            "data.train",
        )
