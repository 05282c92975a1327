"""Panels of the metrics a recipe logs itself (``self.log``), beside the built-in ones.

One panel per metric, titled by its name: the training values ``acc`` as a line, the
evaluation values ``val_acc`` dashed with markers (as loss and val_loss are drawn), and a
test value ``test_acc`` as a star at its step. An evaluation metric without a training
counterpart (``val_bleu``) gets a panel of its own. Which keys are built-in, and how the
keys pair up, is decided in runs.py (``user_metrics``); the drawing helpers are
figures.py's, so a run and a sweep are told apart the same way as on the other panels.
"""

from __future__ import annotations

import logging
from functools import partial

from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from optimus_preflight.plotting.figures import (
    PANELS,
    Panel,
    Style,
    _curves,
    _key_handle,
    _marker_stride,
    _point_marker,
    _slug,
    _test_handle,
    _test_markers,
)
from optimus_preflight.plotting.runs import Run, UserMetric, user_metrics

log = logging.getLogger(__name__)

MAX_USER_PANELS = 12  # more would bury the built-in panels of the overview
# PNG names the plots directory already uses: a metric named like one gets a suffix.
RESERVED_NAMES = frozenset({name for name, _, _ in PANELS} | {"overview"})
RESERVED_PREFIX = "final_loss_vs_"
MAX_NAME_CHARS = 100


def draw_user_metric(metric: UserMetric, ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    """One run: train in the run's colour, val dashed. A sweep: every line in its run's
    colour and style (the run legend names them), val with square markers."""
    ax.set_ylabel(metric.title)
    one_run = len(runs) == 1
    key_color = styles[0].color if one_run else "gray"
    handles = []
    if metric.train and _curves(ax, runs, styles, metric.train, smoothed=True):
        handles.append(_key_handle(Style(key_color, styles[0].linestyle if one_run else "-"), "train"))
    if metric.val:
        if one_run:
            marker = _point_marker(len(runs[0].series(metric.val)[0]))
            drawn = _curves(ax, runs, [Style(key_color, "--")], metric.val)
        else:
            marker = "s"
            drawn = _curves(ax, runs, styles, metric.val, marker=marker, markersize=4, markevery=_marker_stride(runs, metric.val))
        if drawn:
            handles.append(_key_handle(Style(key_color, "--" if one_run else "-"), "val", marker))
    if not handles:
        return None
    if metric.test and _test_markers(ax, runs, styles, metric.test):
        handles.append(_test_handle(key_color))
    return handles


def file_name(title: str, taken: set[str]) -> str:
    """A safe, unique PNG name (without .png) for a metric; ``taken`` holds the names in
    use, compared without case (a case-insensitive file system would merge them)."""
    base = _slug(title).lstrip(".")[:MAX_NAME_CHARS] or "metric"
    if base.lower().startswith(RESERVED_PREFIX):  # a sweep's final-loss plots are named so
        base = f"metric_{base}"
    name, number = base, 1
    while name.lower() in taken:
        name = f"{base}_metric" + (str(number) if number > 1 else "")
        number += 1
    taken.add(name.lower())
    return name


def user_panels(runs: list[Run]) -> tuple[list[tuple[str, str, Panel]], list[str]]:
    """((file name, title, panel) for the first MAX_USER_PANELS metrics, titles left out)."""
    metrics = user_metrics(runs)
    taken = {name.lower() for name in RESERVED_NAMES}
    panels: list[tuple[str, str, Panel]] = [
        (file_name(metric.title, taken), metric.title, partial(draw_user_metric, metric)) for metric in metrics[:MAX_USER_PANELS]
    ]
    return panels, [metric.title for metric in metrics[MAX_USER_PANELS:]]


def log_left_out(runs: list[Run]) -> list[str]:
    """Warn about the metrics past MAX_USER_PANELS; returns their titles."""
    left_out = user_panels(runs)[1]
    if left_out:
        log.warning(
            "optimus-plot: %d metric(s) not plotted (at most %d panels of a recipe's own metrics): %s",
            len(left_out), MAX_USER_PANELS, ", ".join(left_out),
        )
    return left_out
