"""Box targets a loss reads as corners that are not corners (pure, on the tensors of one call).

An IoU, GIoU or area term reads a box ``(x1, y1, x2, y2)`` as two corners: it subtracts the
first pair of columns from the second (``box[:, 2:] - box[:, :2]``, ``x2 - x1`` after
``unbind``; torchvision's ``box_area`` and ``generalized_box_iou_loss`` do the same). Boxes kept
as COCO's ``(x, y, width, height)`` or as ``(cx, cy, w, h)`` have no such order: their third
column is a width, smaller than the left edge in many rows. Read as corners they are empty or
inverted boxes, the area clamps to 0 and the IoU never rewards the right box. Healthy corner
boxes never have ``x2 < x1``, and a conversion (``cx - w / 2``) subtracts a computed tensor, not a
column of the batch, so it is not read here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BOX_COLUMNS = 4
MIN_BOXES = 8
INVERTED_SHARE = 0.1  # of the differences negative: corner boxes never are


@dataclass(frozen=True)
class InvertedCorners:
    shape: tuple[int, ...]  # the box tensor's
    share: float  # of the rows whose second corner lies before the first


def _column(view: torch.Tensor, base: torch.Tensor) -> int | None:
    """The first column of ``base``'s last axis that ``view`` starts at, when it is a slice of it
    along that axis only."""
    if base.dim() < 2 or base.shape[-1] != BOX_COLUMNS or base.stride(-1) != 1 or base.stride(-2) != BOX_COLUMNS:
        return None
    offset = view.storage_offset() - base.storage_offset()
    if offset < 0 or view.numel() * BOX_COLUMNS < base.numel() // 2:
        return None
    return offset % BOX_COLUMNS


def inverted_corners(name: str, args: tuple) -> InvertedCorners | None:
    """``second - first`` over two column slices of one data tensor with 4 columns (no gradient:
    targets, not the model's boxes), the second starting two columns after the first, when
    that difference is negative in at least INVERTED_SHARE of its values."""
    if name not in ("sub", "__sub__") or len(args) < 2:
        return None
    second, first = args[0], args[1]
    if not isinstance(second, torch.Tensor) or not isinstance(first, torch.Tensor) or second.requires_grad \
            or first.requires_grad or not second.is_floating_point() or second.shape != first.shape:
        return None
    base = second._base
    if base is None or first._base is not base or base.requires_grad:
        return None
    columns = _column(second, base), _column(first, base)
    if columns not in ((2, 0), (3, 1)) or second.numel() < MIN_BOXES:
        return None
    share = float(((second - first) < 0).float().mean())
    return InvertedCorners(tuple(base.shape), share) if share >= INVERTED_SHARE else None
