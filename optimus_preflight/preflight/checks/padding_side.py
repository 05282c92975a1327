"""Sequences padded at the start while their lengths count from the start (``data.padding_side``).

A batch that carries each sequence's length beside its padded frames promises that the first
``lengths[i]`` positions are the real ones: ``pack_padded_sequence``, CTC's ``input_lengths``
and length masks all read them that way. A collate or a preprocessing step that pads at the
start (left padding: zeros first, the utterance last) keeps every shape and dtype, and the
model is trained on the padding while the end of every sequence is cut off.

Read from the first batch: a (B,) length vector and a (B, T, ...) tensor whose padded frames
(all values zero, or the padding id of token rows) fill exactly the first ``T - lengths[i]``
positions of most shorter sequences and never the last ``T - lengths[i]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.collate_order import leaf_names
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.pair_lengths import length_vector
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_POSITIONS = 4
MIN_SHORTER = 4  # sequences shorter than the padded axis, before a padding side says anything
MOST = 0.8


def padding_frames(tensor: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the positions whose values are all padding (0 for features; for token ids, the
    id most common at the two ends of the rows)."""
    values = tensor.detach()
    if values.is_floating_point():
        return (values == 0).reshape(values.shape[0], values.shape[1], -1).all(-1)
    ends = torch.cat([values[:, 0], values[:, -1]])
    return values == torch.mode(ends).values


def left_padded(tensor: torch.Tensor, lengths: torch.Tensor) -> tuple[int, int] | None:
    """(sequences padded at the start, sequences shorter than the axis) where most shorter
    sequences hold their padding in exactly the first T - length positions and none in the last
    T - length positions (pure)."""
    if tensor.dim() < 2 or tensor.shape[0] != lengths.shape[0] or tensor.shape[1] < MIN_POSITIONS \
            or tensor.dtype == torch.bool:
        return None
    steps = tensor.shape[1]
    pad = padding_frames(tensor).cpu()
    positions = torch.arange(steps)
    left = right = shorter = 0
    for row, length in zip(pad, lengths.detach().cpu().tolist(), strict=True):
        if not 1 <= length < steps:
            continue
        shorter += 1
        if bool(row[positions >= length].all()):
            right += 1
        elif bool(row[positions < steps - length].all()) and not bool(row[positions >= steps - length].any()):
            left += 1
    if shorter < MIN_SHORTER or right or left < MOST * shorter:
        return None
    return left, shorter


class PaddingSideCheck(Check):
    """LENGTHS_OVER_LEFT_PADDING: sequences padded at the start beside lengths counted from the start."""

    name = "data.padding_side"
    stage = Stage.DATA
    codes = ("LENGTHS_OVER_LEFT_PADDING",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        tensors = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided]
        findings.data["summary"] = "no lengths beside padded sequences"
        longest = max((t.shape[1] for t in tensors if t.dim() >= 2), default=0)
        lengths = [t for t in tensors if length_vector(t, longest)]
        if not lengths:
            return
        names = dict(zip((id(leaf) for leaf in leaves(batch)), leaf_names(batch), strict=False))
        for length in lengths:
            for tensor in tensors:
                if tensor is length or tensor.dim() < 2 or tensor.shape[0] != length.shape[0]:
                    continue
                found = left_padded(tensor, length)
                if found is None:
                    continue
                left, shorter = found
                padded, counted = names.get(id(tensor), "a tensor"), names.get(id(length), "the lengths")
                findings.data["summary"] = f"{padded} padded at the start"
                findings.warning(
                    "LENGTHS_OVER_LEFT_PADDING",
                    f"{padded} {tuple(tensor.shape)} is padded at the start (left-padded): in {left} of the {shorter} "
                    f"sequences shorter than {tensor.shape[1]} positions the padding fills the first T - length "
                    f"positions and the real frames come last, while {counted} counts each sequence's real positions "
                    "from the start. pack_padded_sequence, CTC's input_lengths and length masks read the first "
                    "lengths[i] positions as the sequence, so the model is trained on the padding and the end of "
                    "every shorter sequence is cut off",
                    "Pad at the end: torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True) (or F.pad(x, (0, 0, 0, "
                    "T - len(x))) in the collate_fn), so the first lengths[i] positions are the real ones.",
                    "data.train",
                )
                return
        findings.data["summary"] = "lengths count real positions from the start"
