"""A ``view``/``reshape`` whose result has the input's sizes in another order.

``x.view(B, C, T)`` of a ``(B, T, C)`` tensor does not swap the two axes: it reinterprets
the memory, so each "channel" row holds a run of consecutive (time, channel) values of
different time steps. ``permute``/``transpose`` swap axes; a view to the same sizes in
another order is that mistake, whatever the sizes (moving size-1 axes is the exception:
it changes no element's neighbours).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

RESHAPES = ("view", "reshape")


@dataclass
class ViewAsPermute:
    function: str
    source: tuple[int, ...]
    result: tuple[int, ...]


def permuted_view(source: tuple[int, ...], result: tuple[int, ...]) -> bool:
    """The same sizes in another order, size-1 axes aside (pure)."""
    kept_source, kept_result = [s for s in source if s != 1], [s for s in result if s != 1]
    return len(kept_source) >= 2 and kept_source != kept_result and sorted(kept_source) == sorted(kept_result)


def _groupings(sizes: list[int], parts: int) -> list[list[int]]:
    """The products of every split of ``sizes`` into ``parts`` runs of consecutive axes."""
    if parts == 1:
        return [[math.prod(sizes)]] if sizes else []
    found = []
    for cut in range(1, len(sizes) - parts + 2):
        found += [[math.prod(sizes[:cut]), *rest] for rest in _groupings(sizes[cut:], parts - 1)]
    return found


def regrouped_out_of_order(source: tuple[int, ...], result: tuple[int, ...]) -> bool:
    """A view whose result is the source's axes merged in runs but listed in another order,
    ``(N, C, F, T) -> (N, T, C * F)``: no merge of consecutive axes in order gives it, while one in
    another order does (pure). An in-order merge that fits too leaves the view alone."""
    kept_source, kept_result = [s for s in source if s != 1], [s for s in result if s != 1]
    if len(kept_result) < 2 or len(kept_source) <= len(kept_result) or len(kept_source) > 6:
        return False
    groupings = _groupings(kept_source, len(kept_result))
    if any(grouping == kept_result for grouping in groupings):
        return False
    # The moved axis must stand alone in the result, so the sizes say which it is.
    return any(sorted(grouping) == sorted(kept_result) and any(size in kept_source for size in kept_result)
               for grouping in groupings)


def split_in_front(source: tuple[int, ...], result: tuple[int, ...]) -> bool:
    """A (B, S, E) tensor viewed as (B, H, S, E / H): the last axis split and its first part put
    in front of S, which a view cannot do; only (B, S, H, E / H), then a transpose, splits heads
    (pure). Equal H and S are left alone: (B, S, H, d) has the same sizes."""
    if len(source) != 3 or len(result) != 4:
        return False
    batch, steps, width = source
    return (result[0] == batch and result[2] == steps and result[1] * result[3] == width and steps > 1
            and result[1] > 1 and result[3] > 1 and result[1] != steps)


class ViewWatch:
    """Feed it every torch function call; ``found`` is the first view to permuted sizes."""

    def __init__(self) -> None:
        self.found: ViewAsPermute | None = None

    def observe(self, name: str, args: tuple, out: Any) -> None:
        if self.found is not None or name not in RESHAPES or not args:
            return
        source = args[0]
        if (isinstance(source, torch.Tensor) and isinstance(out, torch.Tensor) and source.dim() >= 2
                and not isinstance(source, torch.nn.Parameter)
                and (permuted_view(tuple(source.shape), tuple(out.shape))
                     or regrouped_out_of_order(tuple(source.shape), tuple(out.shape))
                     or split_in_front(tuple(source.shape), tuple(out.shape)))):
            self.found = ViewAsPermute(name, tuple(source.shape), tuple(out.shape))
