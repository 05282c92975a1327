"""PNG figures of runs, sweeps and the LR range test (matplotlib, Agg backend).

Each panel draws one family of metrics for any number of runs, so a run and a sweep
share the same drawing code: one run gives one curve per panel, a sweep one per job.
In a sweep every run has its own colour *and* line style, so runs whose curves
coincide stay distinguishable, and the legend naming the runs sits outside the axes.

Why this module is long (~500 lines): every figure shares the panel, axis and legend
rules here, so a run, a sweep and the LR range test look alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, ScalarFormatter  # noqa: E402

from optimus_preflight.plotting.runs import Run, label, numeric, swept_parameters  # noqa: E402
from optimus_preflight.plotting.series import MAX_POINTS, downsample, smooth  # noqa: E402

DPI = 100
HEALTHY_RATIO = 1e-3
RATIO_BAND = (1e-5, 1e-1)  # the dynamics watchdog's band
LR_SPREAD_FOR_LOG = 3.0  # runs whose peak LRs differ by half a decade or more: an LR sweep
LR_FLOOR = 1e-3  # on a log LR axis, a schedule's tail towards 0 is cut this far below the smallest peak
LEGEND_ROWS = 25  # entries per legend column before a second column

# Dash patterns that stay apart when drawn over each other; solid comes first so the
# patterned lines of later runs are drawn over it and it shows through their gaps.
LINESTYLES: list[Any] = ["-", "--", ":", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (10, 3)), (0, (1, 4)), (0, (4, 1, 1, 1))]
KEY_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*"]


@dataclass(frozen=True)
class Style:
    """How one run's curves look: colour and line style, both distinct per run."""

    color: Any
    linestyle: Any


def _colors(count: int) -> list[Any]:
    cmap = plt.get_cmap("tab10" if count <= 10 else "viridis")
    return [cmap(i if count <= 10 else i / max(count - 1, 1)) for i in range(count)]


def run_styles(count: int) -> list[Style]:
    return [Style(color, LINESTYLES[index % len(LINESTYLES)]) for index, color in enumerate(_colors(count))]


def _finite_series(run: Run, key: str) -> tuple[list[int], list[float]]:
    """The run's series, or nothing when no value is finite: an all-NaN metric would
    otherwise give a panel with lines that draw no pixel."""
    steps, values = run.series(key)
    return (steps, values) if any(math.isfinite(v) for v in values) else ([], [])


def _point_marker(points: int) -> str | None:
    """A short series (evals, sparse measurements) shows its points; a long one is a line."""
    return "o" if points < 15 else None


def _line(ax: Axes, steps: list[int], values: list[float], style: Style, **kwargs: Any) -> Line2D:
    # below the patterned lines, so a solid curve never hides a coincident dashed one
    zorder = 1.9 if style.linestyle == "-" else 2.0
    if len(steps) > 2 * MAX_POINTS:
        steps, values = downsample(steps, values)
        if "markevery" in kwargs:  # the stride was counted on the full series
            kwargs["markevery"] = max(len(steps) // 8, 1)
    (line,) = ax.plot(steps, values, color=style.color, linestyle=style.linestyle, zorder=zorder, **kwargs)
    return line


def _curves(ax: Axes, runs: list[Run], styles: list[Style], key: str, *, smoothed: bool = False, **kwargs: Any) -> bool:
    drawn = False
    for run, style in zip(runs, styles):
        steps, values = _finite_series(run, key)
        if not steps:
            continue
        drawn = True
        if smoothed and len(values) >= 20:
            if len(runs) == 1:  # the raw trace shows the noise; in a sweep it would bury the other runs
                ax.plot(*downsample(steps, values), color=style.color, alpha=0.25, linewidth=0.8)
            _line(ax, steps, smooth(values), style, **kwargs)
        else:
            options = {"marker": _point_marker(len(steps)), "markersize": 3, **kwargs}
            _line(ax, steps, values, style, **options)
    return drawn


def _key_handle(style: Style, text: str, marker: str | None = None) -> Line2D:
    return Line2D([], [], color=style.color, linestyle=style.linestyle, marker=marker, markersize=4, label=text)


def _test_markers(ax: Axes, runs: list[Run], styles: list[Style], key: str) -> bool:
    """A test metric (measured once, after training) as a star at its step, in the run's colour."""
    drawn = False
    for run, style in zip(runs, styles):
        points = [(step, value) for step, value in zip(*run.series(key)) if math.isfinite(value)]
        if points:
            ax.plot(*points[-1], linestyle="none", marker="*", markersize=10, color=style.color, zorder=3)
            drawn = True
    return drawn


def _test_handle(color: Any) -> Line2D:
    return Line2D([], [], color=color, linestyle="none", marker="*", markersize=7, label="test")


# A panel draws its curves and returns the legend entries that tell its line kinds
# apart (train/val, one per parameter group); None when it had nothing to draw.
Panel = Callable[[Axes, list[Run], list[Style]], list[Line2D] | None]


def draw_loss(ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    """Train loss; one run also gets its val loss and warnings (a sweep has a val panel)."""
    ax.set_ylabel("loss")
    if len(runs) > 1:
        return [] if _curves(ax, runs, styles, "loss", smoothed=True) else None
    style = styles[0]
    val_style = Style(style.color, "--")
    handles = []
    if _curves(ax, runs, styles, "loss", smoothed=True):
        handles.append(_key_handle(style, "train"))
    if _curves(ax, runs, [val_style], "val_loss"):
        handles.append(_key_handle(val_style, "val", _point_marker(len(runs[0].series("val_loss")[0]))))
    if handles and _test_markers(ax, runs, styles, "test_loss"):
        handles.append(_test_handle(style.color))
    for warning in runs[0].warnings():
        ax.axvline(warning["step"], color="tab:red", alpha=0.4, linewidth=0.8)
        ax.annotate(warning["code"], (warning["step"], 1.0), xycoords=("data", "axes fraction"), fontsize=7, color="tab:red", rotation=90, va="top")
    return handles or None


def draw_val_loss(ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    """A sweep's val loss: on the train panel it would need a third way to tell lines apart."""
    ax.set_ylabel("validation loss")
    if len(runs) == 1:
        return None  # drawn on the loss panel, next to its train loss
    if not _curves(ax, runs, styles, "val_loss"):
        return None
    return [_test_handle("gray")] if _test_markers(ax, runs, styles, "test_loss") else []


def _peak_lrs(runs: list[Run]) -> list[float]:
    peaks = []
    for run in runs:
        positive = [v for v in _finite_series(run, "lr")[1] if math.isfinite(v) and v > 0]
        if positive:
            peaks.append(max(positive))
    return peaks


def is_lr_sweep(runs: list[Run]) -> bool:
    """Runs at learning rates half a decade or more apart: their curves only read on a
    log axis (a linear one squashes the small LRs onto zero). One run's warmup or decay
    towards 0 does not count: a schedule reads best on the linear axis it was written on."""
    peaks = _peak_lrs(runs)
    return len(peaks) > 1 and max(peaks) / min(peaks) >= LR_SPREAD_FOR_LOG


def draw_lr(ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    ax.set_ylabel("learning rate")
    if not _curves(ax, runs, styles, "lr"):
        return None
    handles = []
    if len(runs) == 1:
        group_keys = runs[0].keys("lr/")
        if group_keys:
            handles.append(_key_handle(styles[0], "lr"))
        for key, color in zip(group_keys, _colors(10)[1:]):
            group_style = Style(color, ":")
            if _curves(ax, runs, [group_style], key):
                handles.append(_key_handle(group_style, key))
    if is_lr_sweep(runs):
        ax.set_yscale("log")
        floor = min(_peak_lrs(runs)) * LR_FLOOR
        if min(v for run in runs for v in run.series("lr")[1] if v > 0) < floor:
            ax.set_ylim(bottom=floor)
    return handles


def draw_grad_norm(ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    ax.set_ylabel("grad norm (pre-clip)")
    if not _curves(ax, runs, styles, "grad_norm", smoothed=True):
        return None
    ax.set_yscale("log")
    return []


def draw_scale(ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    ax.set_ylabel("GradScaler scale")
    if not _curves(ax, runs, styles, "grad_scale"):
        return None
    ax.set_yscale("log", base=2)
    return []


def _families(ax: Axes, runs: list[Run], styles: list[Style], prefix: str) -> list[Line2D] | None:
    """One curve per key under ``prefix`` (a group, a layer). One run: a colour per key.
    A sweep: the run's colour and line style, and a marker per key, so the run legend
    still names every line."""
    keys = sorted({key for run in runs for key in run.keys(prefix)})
    handles = []
    for index, key in enumerate(keys):
        subject = key.split("/", 1)[1]
        if len(runs) == 1:
            key_style = Style(_colors(len(keys))[index], "-")
            if _curves(ax, runs, [key_style], key):
                handles.append(_key_handle(key_style, subject, _point_marker(len(runs[0].series(key)[0]))))
            continue
        marker = KEY_MARKERS[index % len(KEY_MARKERS)]
        if _curves(ax, runs, styles, key, marker=marker, markersize=4, markevery=_marker_stride(runs, key)):
            handles.append(_key_handle(Style("gray", "-"), subject, marker))
    return handles or None


def _marker_stride(runs: list[Run], key: str) -> int:
    longest = max(len(run.series(key)[0]) for run in runs)
    return max(longest // 8, 1)  # ~8 markers a curve: enough to read, few enough to see the line


def draw_update_ratio(ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    ax.set_ylabel("||dW|| / ||W||")
    handles = _families(ax, runs, styles, "update_ratio/")
    if handles is not None:
        ax.set_yscale("log")
        ax.axhline(HEALTHY_RATIO, color="gray", linestyle=":", linewidth=1)
        ax.axhspan(*RATIO_BAND, color="tab:green", alpha=0.06)
    return handles


def draw_dead_fraction(ax: Axes, runs: list[Run], styles: list[Style]) -> list[Line2D] | None:
    ax.set_ylabel("zero-activation fraction")
    handles = _families(ax, runs, styles, "dead_fraction/")
    ax.set_ylim(0, 1)
    return handles


PANELS: list[tuple[str, str, Panel]] = [
    ("loss", "loss", draw_loss),
    ("val_loss", "validation loss", draw_val_loss),
    ("lr", "learning rate", draw_lr),
    ("grad_norm", "gradient norm", draw_grad_norm),
    ("grad_scale", "GradScaler scale", draw_scale),
    ("update_ratio", "update / weight ratio", draw_update_ratio),
    ("dead_fraction", "dead activations", draw_dead_fraction),
]


def panels_for(runs: list[Run]) -> list[tuple[str, str, Panel]]:
    """The built-in panels, then one per metric the recipe logged itself (user_panels.py)."""
    from optimus_preflight.plotting.user_panels import user_panels  # it draws with this module's helpers

    return PANELS + user_panels(runs)[0]


def plain_number(value: float, _position: int | None = None) -> str:
    """Three significant digits as a plain decimal: 0.003, 0.5, 65536 (never 3e-03)."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else ""
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if decimals else text


def _plain_log_axis(axis: Axis) -> None:
    base = getattr(axis.get_transform(), "base", 10)
    if base == 10:
        low, high = sorted(abs(v) for v in axis.get_view_interval())
        decades = math.log10(high / low) if low > 0 else math.inf
        # under a decade or two the decade ticks alone would leave one label or none
        subs = [float(s) for s in range(1, 10)] if decades < 1 else [1.0, 2.0, 5.0] if decades < 2.5 else [1.0]
        axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(plain_number))
    axis.set_minor_formatter(NullFormatter())


def plain_ticks(ax: Axes) -> None:
    """Tick labels a reader can take at face value: no "1e-3" multiplier or "+1.234"
    offset in the corner, no 10^x mathtext on log axes. Call after the scales are set."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            _plain_log_axis(axis)
        elif isinstance(axis.get_major_formatter(), ScalarFormatter):
            formatter = ScalarFormatter(useOffset=False)
            formatter.set_scientific(False)
            axis.set_major_formatter(formatter)


def _finish(ax: Axes, title: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    plain_ticks(ax)


def legend_outside(ax: Axes, handles: list[Any], fontsize: int = 8) -> None:
    """A legend to the right of the axes: it never covers a curve, however many runs."""
    ncol = max(1, math.ceil(len(handles) / LEGEND_ROWS))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=fontsize, ncol=ncol)


def _run_handles(labels: list[str], styles: list[Style]) -> list[Line2D]:
    return [_key_handle(style, text) for text, style in zip(labels, styles)]


def panel_figures(runs: list[Run], labels: list[str]) -> list[tuple[str, Figure]]:
    """(name, figure) for every panel with data; a sweep's legend names the runs."""
    styles = run_styles(len(runs))
    figures = []
    for name, title, draw in panels_for(runs):
        fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
        handles = draw(ax, runs, styles)
        if handles is None:
            plt.close(fig)
            continue
        _finish(ax, title)
        entries = (_run_handles(labels, styles) if len(runs) > 1 else []) + handles
        if len(entries) > 1:  # a lone curve is named by the title and the y label
            legend_outside(ax, entries)
        figures.append((name, fig))
    return figures


def _panels_with_data(runs: list[Run], styles: list[Style]) -> list[tuple[str, Panel]]:
    """(title, panel) of the panels that draw something; a trial draw decides, so the
    rule for "has data" (finite points, one run or many) lives in the panel alone."""
    probe = plt.figure()
    available = [(title, draw) for _, title, draw in panels_for(runs) if draw(probe.add_subplot(), runs, styles) is not None]
    plt.close(probe)
    return available


def overview_figure(runs: list[Run], labels: list[str]) -> Figure | None:
    """Every panel with data on one figure, two columns; the grid has exactly as many
    axes as panels with data (no blank cell), and a sweep gets one run legend on the right."""
    styles = run_styles(len(runs))
    available = _panels_with_data(runs, styles)
    if not available:
        return None
    columns = 2 if len(available) > 1 else 1
    rows = math.ceil(len(available) / columns)
    fig = plt.figure(figsize=(6 * columns, 3.2 * rows), layout="constrained")
    grid = fig.add_gridspec(rows, 2 * columns)
    for index, (title, draw) in enumerate(available):
        row, column = divmod(index, columns)
        # an odd last panel is centred across both columns' halves rather than leaving a hole
        last_alone = index == len(available) - 1 and columns == 2 and column == 0
        span = slice(1, 3) if last_alone else slice(2 * column, 2 * column + 2)
        ax = fig.add_subplot(grid[row, span])
        handles = draw(ax, runs, styles) or []
        _finish(ax, title)
        if len(handles) > 1:
            legend_outside(ax, handles)
    if len(runs) > 1:
        ncol = max(1, math.ceil(len(runs) / LEGEND_ROWS))
        fig.legend(handles=_run_handles(labels, styles), loc="outside right upper", fontsize=8, ncol=ncol)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_panels(runs: list[Run], labels: list[str], out_dir: Path, *, overview: bool = True) -> list[Path]:
    """One PNG per panel that has data, and an overview of all of them."""
    from optimus_preflight.plotting.user_panels import log_left_out

    log_left_out(runs)
    written = [_save(fig, out_dir / f"{name}.png") for name, fig in panel_figures(runs, labels)]
    if overview:
        fig = overview_figure(runs, labels)
        if fig is not None:
            written.append(_save(fig, out_dir / "overview.png"))
    return written


def plot_run(run: Run, out_dir: Path) -> list[Path]:
    return plot_panels([run], [""], out_dir)  # one run: no legend entry naming it


def plot_sweep(runs: list[Run], out_dir: Path) -> list[Path]:
    swept = swept_parameters(runs)
    labels = [label(run, swept) for run in runs]
    written = plot_panels(runs, labels, out_dir)
    for parameter in swept:
        path = plot_final_vs(runs, parameter, swept, out_dir / f"final_loss_vs_{_slug(parameter)}.png")
        if path is not None:
            written.append(path)
    return written


def is_lr_parameter(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1].lower()
    return leaf in {"lr", "learning_rate"} or leaf.endswith("_lr")


def _log_x(parameter: str, values: list[float]) -> bool:
    """Log for a learning rate (swept in multiples) or anything spanning a decade."""
    if min(values) <= 0:
        return False
    return is_lr_parameter(parameter) or max(values) / min(values) >= 10


def final_vs_figure(runs: list[Run], parameter: str, swept: list[str]) -> Figure | None:
    """Final train and val loss against one swept parameter; one line per combination
    of the other swept parameters."""
    others = [key for key in swept if key != parameter]
    lines: dict[str, list[Run]] = {}
    for run in runs:
        if parameter in run.overrides:
            lines.setdefault(", ".join(f"{k}={run.overrides.get(k)}" for k in others), []).append(run)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    all_values = [run.overrides[parameter] for group in lines.values() for run in group]
    xs_numeric = numeric(all_values)
    categories = sorted(set(all_values))
    drawn = False
    for (name, group), color in zip(lines.items(), _colors(len(lines))):
        xs = numeric([run.overrides[parameter] for run in group]) if xs_numeric else [categories.index(run.overrides[parameter]) for run in group]
        for key, style in (("loss", "-o"), ("val_loss", "--s")):
            points = sorted((x, value) for x, run in zip(xs, group) if (value := run.final(key)) is not None and math.isfinite(value))
            if points:
                drawn = True
                text = ("train" if key == "loss" else "val") + (f" ({name})" if name else "")
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, label=text, markersize=4)
    if not drawn:
        plt.close(fig)
        return None
    if xs_numeric and _log_x(parameter, xs_numeric):
        ax.set_xscale("log")
    if not xs_numeric:
        ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_xlabel(parameter)
    ax.set_ylabel("final loss")
    ax.set_title(f"final loss vs {parameter}")
    ax.grid(True, alpha=0.3)
    plain_ticks(ax)
    legend_outside(ax, ax.get_legend_handles_labels()[0])
    return fig


def plot_final_vs(runs: list[Run], parameter: str, swept: list[str], path: Path) -> Path | None:
    fig = final_vs_figure(runs, parameter, swept)
    return _save(fig, path) if fig is not None else None


def lr_finder_figure(result: dict[str, Any], configured_lr: float | None = None) -> Figure:
    """Loss against LR from an LR range test (``LRRangeResult.to_dict()``)."""
    lrs = result["lrs"]
    raw = [float(v) for v in result["losses"]]
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    ax.plot(lrs, raw, color="tab:blue", alpha=0.3, linewidth=0.8, label="loss")
    smoothed = result.get("smoothed") or []
    ax.plot(lrs[: len(smoothed)], smoothed, color="tab:blue", label="smoothed (5-point median)")
    marks = [("suggested_lr", "tab:green", "suggested"), ("min_loss_lr", "tab:orange", "lowest loss"), ("diverged_lr", "tab:red", "diverged")]
    for key, color, text in marks:
        if isinstance(result.get(key), (int, float)):
            ax.axvline(result[key], color=color, linestyle="--", linewidth=1, label=f"{text} {result[key]:.1e}")
    if configured_lr:
        ax.axvline(configured_lr, color="gray", linestyle=":", linewidth=1, label=f"configured {configured_lr:.1e}")
    finite = [v for v in smoothed if math.isfinite(v)]
    if finite:  # from just below the minimum to a bit above the start: the divergence tail is cut
        low, start = min(finite), finite[0]
        span = max(start - low, 1e-6)
        ax.set_ylim(low - 0.1 * span, start + 0.5 * span)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title("LR range test")
    ax.grid(True, alpha=0.3)
    plain_ticks(ax)
    legend_outside(ax, ax.get_legend_handles_labels()[0])
    return fig


def plot_lr_finder(result: dict[str, Any], path: Path, configured_lr: float | None = None) -> Path:
    return _save(lr_finder_figure(result, configured_lr), path)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)
