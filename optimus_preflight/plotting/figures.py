"""PNG figures of runs, sweeps and the LR range test (matplotlib, Agg backend).

Each panel draws one family of metrics for any number of runs, so a run and a sweep
share the same drawing code: one run gives one curve per panel, a sweep one per job.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from optimus_preflight.plotting.runs import Run, label, numeric, swept_parameters  # noqa: E402

DPI = 100
HEALTHY_RATIO = 1e-3
RATIO_BAND = (1e-5, 1e-1)  # the dynamics watchdog's band


def smooth(values: list[float]) -> list[float]:
    """Centred moving average over ~1/15 of the curve: no lag, unlike an EMA."""
    half = max(len(values) // 30, 1)
    out = []
    for index in range(len(values)):
        window = [v for v in values[max(0, index - half) : index + half + 1] if math.isfinite(v)]
        out.append(sum(window) / len(window) if window else float("nan"))
    return out


def _curves(
    ax: Axes, runs: list[Run], labels: list[str], key: str, *, smoothed: bool = False, style: str = "-", colors: list[Any] | None = None
) -> bool:
    drawn = False
    for run, name, color in zip(runs, labels, colors or _colors(len(runs))):
        steps, values = run.series(key)
        if not steps:
            continue
        drawn = True
        if smoothed and len(values) >= 20:
            if len(runs) == 1:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
            ax.plot(steps, smooth(values), style, color=color, label=name)
        else:
            ax.plot(steps, values, style, color=color, label=name, marker="o" if len(steps) < 15 else None, markersize=3)
    return drawn


def _colors(count: int) -> list[Any]:
    cmap = plt.get_cmap("tab10" if count <= 10 else "viridis")
    return [cmap(i if count <= 10 else i / max(count - 1, 1)) for i in range(count)]


def draw_loss(ax: Axes, runs: list[Run], labels: list[str]) -> bool:
    single = len(runs) == 1
    drawn = _curves(ax, runs, ["train" if single else f"{n} train" for n in labels], "loss", smoothed=True)
    drawn = _curves(ax, runs, ["val" if single else f"{n} val" for n in labels], "val_loss", style="--") or drawn
    if len(runs) == 1:
        for warning in runs[0].warnings():
            ax.axvline(warning["step"], color="tab:red", alpha=0.4, linewidth=0.8)
            ax.annotate(warning["code"], (warning["step"], 1.0), xycoords=("data", "axes fraction"), fontsize=7, color="tab:red", rotation=90, va="top")
    ax.set_ylabel("loss")
    return drawn


def draw_lr(ax: Axes, runs: list[Run], labels: list[str]) -> bool:
    drawn = _curves(ax, runs, labels, "lr")
    if len(runs) == 1:
        for key, color in zip(runs[0].keys("lr/"), _colors(10)[1:]):
            drawn = _curves(ax, runs, [key], key, style=":", colors=[color]) or drawn
    values = [v for run in runs for v in run.series("lr")[1] if v > 0]
    if values and max(values) / min(values) >= 20:  # a sweep over decades, or a long warmup
        ax.set_yscale("log")
    ax.set_ylabel("learning rate")
    return drawn


def draw_grad_norm(ax: Axes, runs: list[Run], labels: list[str]) -> bool:
    drawn = _curves(ax, runs, labels, "grad_norm", smoothed=True)
    ax.set_yscale("log")
    ax.set_ylabel("grad norm (pre-clip)")
    return drawn


def draw_scale(ax: Axes, runs: list[Run], labels: list[str]) -> bool:
    drawn = _curves(ax, runs, labels, "grad_scale")
    ax.set_yscale("log", base=2)
    ax.set_ylabel("GradScaler scale")
    return drawn


def _families(ax: Axes, runs: list[Run], labels: list[str], prefix: str) -> bool:
    """One curve per key under ``prefix`` (a group, a layer): colour per run in a sweep,
    colour per key in a single run; line style tells the keys apart in a sweep."""
    drawn = False
    for run, name, run_color in zip(runs, labels, _colors(len(runs))):
        keys = run.keys(prefix)
        key_colors = _colors(len(keys))
        for index, key in enumerate(keys):
            subject = key.split("/", 1)[1]
            if len(runs) == 1:
                drawn = _curves(ax, [run], [subject], key, colors=[key_colors[index]]) or drawn
            else:
                style = ["-", ":", "-.", "--"][index % 4]
                drawn = _curves(ax, [run], [f"{name} {subject}"], key, style=style, colors=[run_color]) or drawn
    return drawn


def draw_update_ratio(ax: Axes, runs: list[Run], labels: list[str]) -> bool:
    drawn = _families(ax, runs, labels, "update_ratio/")
    if drawn:
        ax.set_yscale("log")
        ax.axhline(HEALTHY_RATIO, color="gray", linestyle=":", linewidth=1)
        ax.axhspan(*RATIO_BAND, color="tab:green", alpha=0.06)
    ax.set_ylabel("||dW|| / ||W||")
    return drawn


def draw_dead_fraction(ax: Axes, runs: list[Run], labels: list[str]) -> bool:
    drawn = _families(ax, runs, labels, "dead_fraction/")
    ax.set_ylim(0, 1)
    ax.set_ylabel("zero-activation fraction")
    return drawn


Panel = Callable[[Axes, list[Run], list[str]], bool]
PANELS: list[tuple[str, str, Panel]] = [
    ("loss", "loss", draw_loss),
    ("lr", "learning rate", draw_lr),
    ("grad_norm", "gradient norm", draw_grad_norm),
    ("grad_scale", "GradScaler scale", draw_scale),
    ("update_ratio", "update / weight ratio", draw_update_ratio),
    ("dead_fraction", "dead activations", draw_dead_fraction),
]


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _finish(ax: Axes, title: str, entries: int) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    if 0 < entries <= 12:
        ax.legend(fontsize=7)


def plot_panels(runs: list[Run], labels: list[str], out_dir: Path, *, overview: bool = True) -> list[Path]:
    """One PNG per panel that has data, and an overview of all of them."""
    written, available = [], []
    for name, title, draw in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4))
        if draw(ax, runs, labels):
            _finish(ax, title, len(ax.get_legend_handles_labels()[0]))
            written.append(_save(fig, out_dir / f"{name}.png"))
            available.append((title, draw))
        else:
            plt.close(fig)
    if overview and available:
        columns = 2 if len(available) > 1 else 1
        rows = math.ceil(len(available) / columns)
        fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
        for ax, (title, draw) in zip(axes.flat, available):
            draw(ax, runs, labels)
            _finish(ax, title, len(ax.get_legend_handles_labels()[0]) if len(runs) <= 4 else 0)
        for ax in list(axes.flat)[len(available) :]:
            ax.set_visible(False)
        fig.tight_layout()
        if len(runs) > 4:  # too many curves for a legend per panel: one for the figure
            handles = [Line2D([], [], color=color) for color in _colors(len(runs))]
            fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(runs), 3), fontsize=8)
        written.append(_save(fig, out_dir / "overview.png"))
    return written


def plot_run(run: Run, out_dir: Path) -> list[Path]:
    return plot_panels([run], [""], out_dir)  # one run: no legend entry per curve


def plot_sweep(runs: list[Run], out_dir: Path) -> list[Path]:
    swept = swept_parameters(runs)
    labels = [label(run, swept) for run in runs]
    written = plot_panels(runs, labels, out_dir)
    for parameter in swept:
        path = plot_final_vs(runs, parameter, swept, out_dir / f"final_loss_vs_{_slug(parameter)}.png")
        if path is not None:
            written.append(path)
    return written


def plot_final_vs(runs: list[Run], parameter: str, swept: list[str], path: Path) -> Path | None:
    """Final train and val loss against one swept parameter; one line per combination
    of the other swept parameters."""
    others = [key for key in swept if key != parameter]
    lines: dict[str, list[Run]] = {}
    for run in runs:
        if parameter in run.overrides:
            lines.setdefault(", ".join(f"{k}={run.overrides.get(k)}" for k in others), []).append(run)
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    all_values = [run.overrides[parameter] for group in lines.values() for run in group]
    xs_numeric = numeric(all_values)
    categories = sorted(set(all_values))
    drawn = False
    for (name, group), color in zip(lines.items(), _colors(len(lines))):
        xs = numeric([run.overrides[parameter] for run in group]) if xs_numeric else [categories.index(run.overrides[parameter]) for run in group]
        for key, style in (("loss", "-o"), ("val_loss", "--s")):
            points = sorted((x, run.final(key)) for x, run in zip(xs, group) if run.final(key) is not None)
            if points:
                drawn = True
                text = ("train" if key == "loss" else "val") + (f" ({name})" if name else "")
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, label=text, markersize=4)
    if not drawn:
        plt.close(fig)
        return None
    if xs_numeric and min(xs_numeric) > 0 and max(xs_numeric) / min(xs_numeric) >= 10:
        ax.set_xscale("log")
    if not xs_numeric:
        ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.set_xlabel(parameter)
    ax.set_ylabel("final loss")
    ax.set_title(f"final loss vs {parameter}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_lr_finder(result: dict[str, Any], path: Path, configured_lr: float | None = None) -> Path:
    """Loss against LR from an LR range test (``LRRangeResult.to_dict()``)."""
    lrs = result["lrs"]
    raw = [float(v) for v in result["losses"]]
    fig, ax = plt.subplots(figsize=(7, 4))
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
    ax.legend(fontsize=7)
    return _save(fig, path)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)
