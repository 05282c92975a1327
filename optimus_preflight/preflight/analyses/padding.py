"""Padding in the targets a criterion trains on (catalog O15), from tensors alone.

Padding shows in the targets as one id filling a contiguous run at the end (or the
start, for left padding) of many rows, and appearing almost nowhere else: the pad id.
Ordinary tokens repeat at row ends too (spaces, newlines, an EOS), but they also
fill the middle of the rows, so they are told apart by where else they occur.
A mapping batch (Hugging Face style) says it outright: ``attention_mask == 0`` marks
padding, and the labels there must be the criterion's ``ignore_index``.

Pure functions over tensors; ``loss_spy`` calls them on what reaches the criterion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from optimus_preflight.training.batches import leaves

# A run this share of the real targets dilutes a mean measurably; smaller ones are noise.
MIN_SHARE = 0.05
# The pad id occurs (nearly) only inside the edge runs; a real token fills rows' middles.
EDGE_ONLY = 0.9
MIN_PADDED_ROWS = 2  # rows with an edge run of two or more
SORTED_ROWS = 0.9  # this share of rows in order: runs at the edges are the order's, not padding's


def mostly_sorted(rows: torch.Tensor, valid: torch.Tensor) -> bool:
    """Rows in ascending (or descending) order, as a sorting task's targets are: there the
    smallest id fills the start of many rows and nothing else, exactly as left padding does.
    Text and label sequences are never in order, padded or not. Read on fully valid rows of
    three or more distinct ids (a padded row of one token, [7, 0, 0], is in order too)."""
    whole = rows[valid.all(dim=1)]
    if whole.shape[0] < MIN_PADDED_ROWS or whole.shape[1] < 3:
        return False
    distinct = (whole.sort(dim=1).values.diff(dim=1) != 0).sum(dim=1) + 1
    whole = whole[distinct >= 3]
    if whole.shape[0] < MIN_PADDED_ROWS:
        return False
    steps = whole.diff(dim=1)
    ordered = (steps >= 0).all(dim=1) | (steps <= 0).all(dim=1)
    return float(ordered.float().mean()) >= SORTED_ROWS


@dataclass
class PaddingProfile:
    value: int  # the id that pads
    side: str  # "end" (right padding) or "start" (left padding)
    padded_rows: int
    rows: int
    positions: int  # target positions inside the runs
    targets: int  # target positions not equal to ignore_index

    @property
    def share(self) -> float:
        return self.positions / max(self.targets, 1)


def sequence_shapes(batch: Any) -> list[tuple[int, int]]:
    """(rows, length) of the batch's integer tensors of two or more dimensions (token
    ids, labels), and (rows, length - 1) for targets shifted by one position: the
    shapes a flattened target may be viewed as."""
    shapes: list[tuple[int, int]] = []
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2 and not leaf.is_floating_point() and leaf.dtype != torch.bool:
            rows, length = int(leaf.shape[0]), int(leaf.shape[1])
            for shape in ((rows, length), (rows, length - 1)):
                if shape[1] >= 2 and shape not in shapes:
                    shapes.append(shape)
    return shapes


def as_rows(target: torch.Tensor, shapes: list[tuple[int, int]]) -> torch.Tensor | None:
    """The target as (rows, positions): itself when 2-D, a view of a flattened one when
    its length matches one of ``shapes``; None when it has no sequence structure."""
    if target.dim() == 2 and target.shape[0] >= 2 and target.shape[1] >= 2:
        return target
    if target.dim() == 1:
        for rows, length in shapes:
            if rows >= 2 and rows * length == target.numel():
                return target.view(rows, length)
    return None


def _edge_runs(rows: torch.Tensor, valid: torch.Tensor, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the edge value (last/first target that is not ignored) and a mask of
    the run of it at that edge; ignored positions inside the run do not break it (Hugging
    Face's shifted labels end every row with one)."""
    if side == "start":
        value, mask = _edge_runs(rows.flip(1), valid.flip(1), "end")
        return value, mask.flip(1)
    positions = torch.arange(rows.shape[1], device=rows.device)
    last = torch.where(valid, positions, -1).max(dim=1).values
    value = rows.gather(1, last.clamp_min(0).unsqueeze(1)).squeeze(1)
    same = ~valid | (rows == value.unsqueeze(1))
    run = same.flip(1).long().cumprod(dim=1).flip(1).bool()
    return value, run & valid & (last >= 0).unsqueeze(1)


def edge_padding(rows: torch.Tensor, ignore_index: int | None) -> tuple[PaddingProfile | None, torch.Tensor | None]:
    """The padding in integer targets ``rows`` (rows, positions) that the criterion does
    not ignore, with the mask of its positions; (None, None) when there is none."""
    with torch.no_grad():
        rows = rows.detach()
        valid = rows != ignore_index if ignore_index is not None else torch.ones_like(rows, dtype=torch.bool)
        targets = int(valid.sum())
        if mostly_sorted(rows, valid):
            return None, None
        best: tuple[PaddingProfile, torch.Tensor] | None = None
        for side in ("end", "start"):
            value, run = _edge_runs(rows, valid, side)
            lengths = run.sum(dim=1)
            long_runs = value[lengths >= 2]
            if long_runs.numel() < MIN_PADDED_ROWS:
                continue
            pad = int(long_runs.mode().values)
            padded = value == pad
            mask = run & padded.unsqueeze(1)
            positions = int(mask.sum())
            occurrences = int(((rows == pad) & valid).sum())
            if (int((padded & (lengths >= 2)).sum()) < MIN_PADDED_ROWS or positions < EDGE_ONLY * occurrences
                    or positions < MIN_SHARE * targets):
                continue
            profile = PaddingProfile(pad, side, int((padded & (lengths > 0)).sum()), rows.shape[0], positions, targets)
            if best is None or profile.positions > best[0].positions:
                best = (profile, mask)
    return best if best is not None else (None, None)


@dataclass
class MaskDisagreement:
    positions: int  # labels at attention_mask == 0 that are not ignore_index
    targets: int  # labels that are not ignore_index
    value: int | None  # the commonest label there (the pad id)


def mask_disagreement(batch: Any, ignore_index: int) -> MaskDisagreement | None:
    """Labels the loss trains on where ``attention_mask`` marks padding, for a mapping
    batch holding both with the same shape; None when the batch has no such pair."""
    if not isinstance(batch, Mapping):
        return None
    mask, labels = batch.get("attention_mask"), batch.get("labels")
    if not (isinstance(mask, torch.Tensor) and isinstance(labels, torch.Tensor)) or mask.shape != labels.shape:
        return None
    with torch.no_grad():
        trained = labels != ignore_index
        wrong = trained & (mask == 0)
        positions = int(wrong.sum())
        value = int(labels[wrong].mode().values) if positions else None
        return MaskDisagreement(positions, int(trained.sum()), value)
