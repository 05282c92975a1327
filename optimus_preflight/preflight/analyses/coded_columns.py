"""Feature columns that hold category codes used as numbers (pure).

A categorical column label-encoded (``LabelEncoder``, ``df[col].cat.codes``, a city id, a zip
code index) and fed to a linear layer as one float makes the network treat code 17 as
between codes 16 and 18. For an ordered quantity (age, a count, a rating) neighbouring values
have similar effects on the target; for codes of unordered categories the effect of one code
says nothing about the next. Both are read from the data: the column's levels (6 to 200
distinct values, in value order), the mean target per level, and how strongly those means
vary between levels (an F statistic against the within-level noise) and follow each other
(the lag-1 correlation of the level means along the value order). A column whose levels
matter a lot but in no order is a code. Only levels on one grid (codes, however scaled) are
judged: a cyclic encoding such as cos(hour) orders its values otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_ROWS = 512
MIN_LEVELS, MAX_LEVELS = 6, 200
MIN_LEVEL_ROWS = 4
MAX_COLUMNS = 256
STRONG = 8.0  # F statistic of the level means: their spread far above the noise
ROUGH = 0.2  # lag-1 correlation of neighbouring levels' means at most this: no order
MAX_GAP, GRID_TOLERANCE = 10, 0.02  # levels on one grid: gaps whole multiples (up to 10) of the smallest


@dataclass(frozen=True)
class CodedColumn:
    column: int
    levels: int
    f_statistic: float
    neighbour_correlation: float


def evenly_spaced(levels: torch.Tensor) -> bool:
    """Sorted distinct values on one grid (every gap a whole multiple of the smallest): codes
    0..K-1, raw, standardised or min-max scaled, with some codes absent. A cyclic encoding
    (cos of the hour) or a measured quantity has irregular gaps."""
    gaps = levels[1:] - levels[:-1]
    multiples = gaps / gaps.min().clamp_min(1e-30)
    return bool((multiples <= MAX_GAP).all()) and bool(((multiples - multiples.round()).abs() <= GRID_TOLERANCE).all())


def _level_means(values: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    levels, index = torch.unique(values, return_inverse=True)
    counts = torch.bincount(index, minlength=len(levels)).double()
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS or int(counts.min()) < MIN_LEVEL_ROWS or not evenly_spaced(levels):
        return None
    sums = torch.zeros(len(levels), dtype=torch.float64).index_add_(0, index, target)
    means = sums / counts
    within = float(((target - means[index]) ** 2).sum()) / max(len(target) - len(levels), 1)
    between = float((counts * (means - target.mean()) ** 2).sum()) / (len(levels) - 1)
    return means, counts, between / max(within, 1e-12)


def coded_columns(features: torch.Tensor, target: torch.Tensor) -> list[CodedColumn]:
    """Columns of ``features`` (N, D) whose few levels shift ``target`` (N,) strongly but in no
    order of their values (pure)."""
    if features.dim() != 2 or len(features) < MIN_ROWS or features.shape[1] > MAX_COLUMNS or len(target) != len(features):
        return []
    y = target.double()
    if not bool(torch.isfinite(y).all()) or float(y.std()) == 0:
        return []
    found = []
    for column in range(features.shape[1]):
        values = features[:, column]
        if not bool(torch.isfinite(values).all()):
            continue
        stats = _level_means(values.double(), y)
        if stats is None:
            continue
        means, _, f_statistic = stats
        a, b = means[:-1] - means.mean(), means[1:] - means.mean()
        neighbours = float((a * b).sum() / (a.norm() * b.norm()).clamp_min(1e-12))
        if f_statistic >= STRONG and neighbours <= ROUGH:
            found.append(CodedColumn(column, len(means), f_statistic, neighbours))
    return found
