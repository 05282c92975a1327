"""0/1 masks multiplied into trained weights, read from one call (pure functions; fed by
``PitfallWatch``): magnitude pruning the wrong way round, structured pruning over the input
columns, and a connectivity mask registered as a trained parameter."""

from __future__ import annotations

from typing import Any

import torch

MASK_MIN_VALUES = 64


def zero_one(mask: torch.Tensor) -> torch.Tensor | None:
    """``mask`` as booleans (True: kept) when it holds only 0 and 1 (or is boolean); else None."""
    kept = mask.detach()
    if kept.dtype == torch.bool:
        return kept
    return kept != 0 if bool(((kept == 0) | (kept == 1)).all()) else None


def mask_keeps_smallest(weight: Any, mask: Any) -> tuple[tuple[int, ...], float] | None:
    """(shape, share pruned) where a trained weight of 2+ dims is multiplied by a 0/1 mask of its
    shape that keeps exactly its smallest magnitudes: a magnitude-pruning comparison the wrong way
    round (``abs(w) < threshold``), which prunes whatever the optimizer grows (pure)."""
    if not (isinstance(weight, torch.nn.Parameter) and weight.requires_grad and isinstance(mask, torch.Tensor)) \
            or weight.dim() < 2 or mask.shape != weight.shape or weight.numel() < MASK_MIN_VALUES:
        return None
    kept = zero_one(mask)
    if kept is None:
        return None
    pruned_share = 1.0 - float(kept.float().mean())
    if not 0.05 <= pruned_share <= 0.95:
        return None
    magnitude = weight.detach().abs()
    # Strictly below: a weight of ties (zeros) masked any way says nothing.
    if float(magnitude[kept].max()) < float(magnitude[~kept].min()):
        return tuple(weight.shape), pruned_share
    return None


def trained_mask(weight: Any, mask: Any) -> tuple[tuple[int, ...], float] | None:
    """(shape, share of zeros) where a trained weight is multiplied by a Parameter of its shape that
    requires grad and holds only 0 and 1: a connectivity mask (MADE's autoregressive masks, a
    pruning mask) registered as nn.Parameter, which the optimizer moves off 0 and 1 (pure)."""
    if not all(isinstance(t, torch.nn.Parameter) and t.requires_grad for t in (weight, mask)) \
            or mask.shape != weight.shape or mask.dim() < 2 or mask.numel() < MASK_MIN_VALUES:
        return None
    kept = zero_one(mask)
    if kept is None:
        return None
    zeros = 1.0 - float(kept.float().mean())
    return (tuple(mask.shape), zeros) if 0.05 <= zeros <= 0.95 else None


def mask_over_inputs(weight: Any, mask: Any) -> tuple[tuple[int, ...], int] | None:
    """(shape, columns zeroed) where a trained (out, in) weight is multiplied by a 0/1 mask of shape
    (1, in) or (in,): structured pruning whose norms were taken over dim 0, one per input feature,
    so it removes inputs instead of neurons (rows, a mask of shape (out, 1)) (pure)."""
    if not (isinstance(weight, torch.nn.Parameter) and weight.requires_grad and isinstance(mask, torch.Tensor)) \
            or weight.dim() != 2 or weight.shape[0] < 2 or weight.shape[1] < 4 \
            or tuple(mask.shape) not in ((1, weight.shape[1]), (weight.shape[1],)):
        return None
    kept = zero_one(mask.reshape(-1))
    if kept is None:
        return None
    zeroed = int((~kept).sum())
    if not 0.05 * len(kept) <= zeroed < len(kept):
        return None
    return tuple(weight.shape), zeroed
