"""Predictions that change with the amount of padding (``step.padding_invariance``).

``PADDING_CHANGES_OUTPUT``: padding exists only to stack sequences of different lengths, so
a sample's prediction must not depend on how much of it its batch needed. When it does, the
padding reaches the prediction: a mean pooled over every position (pad vectors included),
attention whose mask hides the padded *queries* instead of the padded *keys* (or no mask), an
``EmbeddingBag`` or sum over ids without ``padding_idx``. The model then learns from the
batch's longest sequence as much as from each sample, and the same text gets another
prediction in another batch or at serving time.

Read from the model: one eval-mode forward of the first batch, then another with every row
given more right padding (the batch's own pad id; an ``attention_mask`` gets zeros, token
labels the ignore index). Only per-sample outputs, a (B, C) or (B,) tensor, are compared.
The change of each padded row is measured against how much the outputs differ between
samples; it fires when most rows move by a good share of that. Masked attention, packed
RNNs, pooling over the real tokens and left padding (not extended) stay quiet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import model_outputs
from optimus_preflight.preflight.analyses.padding import edge_padding
from optimus_preflight.preflight.checks.attention_mask import padding_of
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

EXTRA = 8  # pad positions added to every row (at least; half the width when that is more)
MOVED = 0.2  # a row's change, as a share of the outputs' spread between samples ...
ROWS_SHARE = 0.6  # ... in this share of the rows
FILL = {"attention_mask": 0, "labels": -100, "token_type_ids": 0, "special_tokens_mask": 1}


def _ids_of(batch: Any) -> tuple[Any, torch.Tensor] | None:
    """(key or index, the (B, T) token ids) of a tuple or mapping batch."""
    items = batch.items() if isinstance(batch, Mapping) else enumerate(batch) if isinstance(batch, (list, tuple)) else ()
    for key, value in items:
        if isinstance(value, torch.Tensor) and key not in FILL and padding_of(value) is not None:
            return key, value
    return None


def widened(batch: Any, key: Any, ids: torch.Tensor, pad: int, extra: int) -> Any | None:
    """``batch`` with ``extra`` positions of padding appended to every row of the ids and of
    the (B, T) tensors that go with them; None when another (B, T) tensor has no known fill."""
    def grow(value: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.cat([value, value.new_full((value.shape[0], extra), fill)], dim=1)

    if isinstance(batch, Mapping):
        out = dict(batch)
        for name, value in batch.items():
            if not isinstance(value, torch.Tensor) or value.shape[:2] != ids.shape or value.dim() != 2:
                continue
            if name == key:
                out[name] = grow(value, pad)
            elif name in FILL:
                out[name] = grow(value, FILL[name])
            else:
                return None
        return type(batch)(out) if not isinstance(batch, dict) else out
    items = list(batch)
    for index, value in enumerate(items):
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == ids.shape and index != key:
            return None  # token labels or a mask beside the ids: which fill is meant is unknown
    items[key] = grow(ids, pad)
    return type(batch)(items) if isinstance(batch, tuple) else items


def _per_sample(outputs: list[torch.Tensor] | None, rows: int) -> torch.Tensor | None:
    if not outputs:
        return None
    first = outputs[0]
    if first.shape[0] != rows or first.dim() > 2 or not first.is_floating_point():
        return None
    return first.float().reshape(rows, -1).cpu()


class PaddingInvarianceCheck(Check):
    """PADDING_CHANGES_OUTPUT: more right padding moves the per-sample predictions."""

    name = "step.padding_invariance"
    stage = Stage.STEP
    codes = ("PADDING_CHANGES_OUTPUT",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no right-padded token ids"
        batch = ctx.artifacts.first_batch
        found = _ids_of(batch)
        if found is None:
            return
        key, ids = found
        profile, mask = edge_padding(ids.detach().cpu(), None)
        if profile is None or profile.side != "end" or mask is None:
            return
        if isinstance(batch, Mapping) and "attention_mask" not in batch and hasattr(ctx.model, "config"):
            return  # step.attention_mask names a Hugging Face model given no mask
        extra = max(EXTRA, ids.shape[1] // 2)
        wider = widened(batch, key, ids, profile.value, extra)
        if wider is None:
            return
        before = _per_sample(model_outputs(ctx, batch), ids.shape[0])
        after = _per_sample(model_outputs(ctx, wider), ids.shape[0])
        if before is None or after is None or before.shape != after.shape or not bool(torch.isfinite(before).all()):
            return
        spread = float((before - before.mean(0)).norm(dim=1).median())
        if spread <= 1e-8:
            return
        change = (after - before).norm(dim=1) / spread
        moved = float((change >= MOVED).float().mean())
        findings.data.update(pad_id=profile.value, extra=extra, median_change=round(float(change.median()), 4),
                             moved_rows=round(moved, 3))
        findings.data["summary"] = (f"{extra} more pad positions move the median row's output by "
                                    f"{float(change.median()):.2f}x the spread between samples")
        if moved < ROWS_SHARE:
            return
        findings.warning(
            "PADDING_CHANGES_OUTPUT",
            f"the predictions depend on how much padding a batch has: giving every row of the (B, {ids.shape[1]}) "
            f"token ids {extra} more pad positions (id {profile.value}) moves {moved:.0%} of the samples' outputs by "
            f"{float(change.median()):.2f}x (median) the spread between samples (eval mode). The padding reaches the "
            "prediction: a mean pooled over every position, pad vectors included; attention whose mask hides the "
            "padded queries instead of the padded keys (scores.masked_fill(pad[:, :, None], ...) where pad[:, None, "
            ":] is meant), or no mask at all; an EmbeddingBag or a sum over ids without padding_idx. The model learns "
            "from the batch's longest sequence, and the same sample gets another prediction in another batch",
            "Keep the padding out of everything that mixes positions: mask the keys (scores.masked_fill(pad[:, None, "
            ":], float('-inf')), or key_padding_mask=ids == pad_id for nn.MultiheadAttention), pool over the real "
            "tokens only ((h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)), and give nn.Embedding / "
            "nn.EmbeddingBag padding_idx=pad_id.",
            "model",
        )
