"""A metric's series made drawable: smoothed, and cut to what a figure can show.

A long run logs hundreds of thousands of steps; a PNG a few thousand pixels wide shows
no more than that many x positions. Both functions are linear in the series' length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# Buckets per drawn line; each keeps its minimum and maximum (about 2x the pixel width
# of a panel, so the line looks the same as with every point).
MAX_POINTS = 2000


def smooth(values: list[float]) -> list[float]:
    """Centred moving average over ~1/15 of the curve: no lag, unlike an EMA. Running
    sums make it linear in the length (a long run has hundreds of thousands of points)."""
    half = max(len(values) // 30, 1)
    data = np.asarray(values, dtype=float)
    finite = np.isfinite(data)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, data, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    index = np.arange(len(data))
    low, high = np.maximum(index - half, 0), np.minimum(index + half + 1, len(data))
    window_counts = counts[high] - counts[low]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (sums[high] - sums[low]) / window_counts
    return np.where(window_counts > 0, means, np.nan).tolist()


def downsample(steps: Sequence[float], values: Sequence[float], max_points: int = MAX_POINTS) -> tuple[Any, Any]:
    """At most ~2 * max_points points to draw, however long the run: the minimum and the
    maximum of each bucket of consecutive points, in step order, so a spike (or a dip)
    of a single step stays on the plot; a bucket with no finite value keeps one NaN, so
    a gap stays a gap. A short series is returned as it is."""
    count = len(values)
    if count <= 2 * max_points:
        return steps, values
    size = math.ceil(count / max_points)
    x, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    buckets = np.concatenate([y, np.full((-count) % size, np.nan)]).reshape(-1, size)
    finite = np.isfinite(buckets)
    lowest = np.where(finite, buckets, np.inf).argmin(axis=1)
    highest = np.where(finite, buckets, -np.inf).argmax(axis=1)
    starts = np.arange(len(buckets)) * size
    keep = np.unique(np.concatenate([starts + lowest, starts + highest]))
    keep = keep[keep < count]
    return x[keep], y[keep]
