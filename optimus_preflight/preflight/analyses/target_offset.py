"""Where a forecast's targets start, relative to the end of their input window.

Sliding windows over a series hand each sample ``x = series[i : i + W]`` and targets
``series[i + W - 1 + k : ...]`` for one fixed lead ``k`` (1 for the next step). Built in
another order (an ``(H, N)`` stack of targets per lead time ``.reshape(N, H)``'d instead of
transposed, a target array shuffled or sorted apart from the windows), each sample's targets
are still values of the series, yet they start at a different distance from its window for
every sample.

Read from many windows at once: overlapping windows repeat the series' values, so the
position of a value in other windows dates it. For each sample, the lead from its last input
value to its first target is found where both values occur in one window; with one fixed
lead for nearly every sample the targets follow their windows. The test is exact (values
matched bit for bit), so it only judges targets taken from the same numbers as the inputs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import torch

MIN_SAMPLES = 64  # samples whose targets could be dated
FOUND_SHARE = 0.8  # of the samples, the first target occurs among the inputs
CONSISTENT = 0.3  # a lead shared by this share of the dated samples: the targets follow their windows
MAX_POSITIONS = 64  # occurrences kept per value: every window of a series of distinct values


@dataclass(frozen=True)
class OffsetScatter:
    samples: int  # whose first target was dated
    best_lead: int | None
    best_share: float  # of the dated samples, the most common lead's
    leads_seen: int  # distinct leads


def target_offsets(windows: torch.Tensor, targets: torch.Tensor) -> OffsetScatter | None:
    """Whether the first targets of ``(N, W)`` windows lie at one lead past each window, or None
    when the targets are not values of the windows' series."""
    if windows.dim() != 2 or targets.dim() != 2 or windows.shape[0] != targets.shape[0] or windows.shape[1] < 4:
        return None
    x = windows.detach().cpu().float()
    first = targets[:, 0].detach().cpu().float()
    positions: dict[float, list[tuple[int, int]]] = defaultdict(list)
    for row, values in enumerate(x.tolist()):
        for column, value in enumerate(values):
            found = positions[value]
            if len(found) < MAX_POSITIONS:
                found.append((row, column))
    last = x[:, -1].tolist()
    present = 0
    leads: list[int] = []
    for value, start in zip(first.tolist(), last):
        after = positions.get(value)
        if not after:
            continue
        present += 1
        before = {row: column for row, column in positions.get(start, [])}
        dated = sorted({column - before[row] for row, column in after if row in before and column > before[row]})
        if dated:
            leads.append(dated[0])
    if present < FOUND_SHARE * len(last) or len(leads) < MIN_SAMPLES:
        return None
    counts = Counter(leads)
    lead, count = counts.most_common(1)[0]
    return OffsetScatter(len(leads), lead, count / len(leads), len(counts))


def scattered(found: OffsetScatter | None) -> bool:
    return found is not None and found.best_share < CONSISTENT
