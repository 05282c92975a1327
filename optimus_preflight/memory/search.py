"""The largest micro-batch that fits a memory limit, found with the estimator (no OOM trials).

Peak memory grows almost linearly with the micro-batch size, so each probe after the
first two goes where the line through the nearest known points crosses the limit, and
falls back to bisection when that guess would not shrink the bracket.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from optimus_preflight.training.batches import batch_size_of, map_batch


def resize_batch(batch: Any, new_size: int, old_size: int | None = None) -> Any:
    """Meta tensors shaped like ``batch`` with the leading (batch) dimension set to ``new_size``."""
    old = batch_size_of(batch) if old_size is None else old_size

    def resize(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        shape = list(value.shape)
        if shape and shape[0] == old:
            shape[0] = new_size
        return torch.empty(shape, dtype=value.dtype, device="meta")

    return map_batch(resize, batch)


@dataclass
class BatchSearch:
    """``largest``: the largest micro-batch predicted to fit (0: not even 1 fits);
    ``at_least``: True when the search stopped at its upper bound while still fitting."""

    largest: int
    at_least: bool = False
    probes: dict[int, int] = field(default_factory=dict)


def largest_fitting_batch(
    need_bytes: Callable[[int], int],
    limit_bytes: int,
    current: int,
    *,
    current_need: int | None = None,
    upper: int | None = None,
    max_probes: int = 12,
) -> BatchSearch:
    """Search micro-batch sizes ``1..upper`` for the largest with ``need_bytes(n) <= limit``.

    ``need_bytes`` is assumed non-decreasing in ``n``; ``upper`` defaults to 8x ``current``.
    """
    upper = upper or max(8 * current, 1)
    probes: dict[int, int] = {}
    if current_need is not None:
        probes[current] = current_need

    def need(n: int) -> int:
        if n not in probes:
            probes[n] = need_bytes(n)
        return probes[n]

    fits = lambda n: need(n) <= limit_bytes  # noqa: E731
    if fits(current):
        lo, hi = current, None
    else:
        if current == 1 or not fits(1):
            return BatchSearch(0, probes=probes)
        lo, hi = 1, current
    moved: list[str] = []
    while len(probes) < max_probes:
        ceiling = hi if hi is not None else upper + 1
        if ceiling - lo <= 1:
            break
        if hi is None:
            guess = _linear_guess(probes, limit_bytes, lo, lo) or 2 * lo
            guess = min(max(guess, lo + 1), upper)
        else:
            # Regula falsi kept away from the ends; bisect when one end moved twice in a row
            # (the peak is a step function of the batch where allocator blocks round up).
            margin = max((hi - lo) // 8, 1)
            guess = _linear_guess(probes, limit_bytes, lo, hi) or (lo + hi) // 2
            if moved[-2:] in (["lo", "lo"], ["hi", "hi"]):
                guess = (lo + hi) // 2
            guess = min(max(guess, lo + margin), hi - margin)
        if not fits(guess):
            hi = guess
            moved.append("hi")
            continue
        lo = guess
        moved.append("lo")
        # The line usually lands just under the limit: the next size closes the bracket.
        if guess + 1 < (hi if hi is not None else upper + 1):
            if fits(guess + 1):
                lo = guess + 1
            else:
                hi = guess + 1
                moved.append("hi")
    at_least = hi is None and lo >= upper
    return BatchSearch(lo, at_least, probes)


def _linear_guess(probes: dict[int, int], limit: int, lo: int, hi: int) -> int | None:
    """Where the line through the probes at ``lo`` and ``hi`` (or the two nearest) reaches ``limit``."""
    if lo == hi or hi not in probes:
        below = [n for n in sorted(probes) if n < lo]
        if not below:
            return None
        lo, hi = below[-1], lo
    slope = (probes[hi] - probes[lo]) / (hi - lo)
    if slope <= 0:
        return None
    return int(lo + (limit - probes[lo]) // slope)
