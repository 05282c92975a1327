"""optimus-plot figures, checked on the matplotlib objects themselves: where the legend
sits, how runs are told apart, which panels exist, axis scales and tick labels.
Runs are metrics.jsonl files written by hand, so nothing here trains."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from optimus_preflight.plotting.figures import (  # noqa: E402
    final_vs_figure,
    lr_finder_figure,
    overview_figure,
    panel_figures,
    plain_number,
    run_styles,
)
from optimus_preflight.plotting.plot_cli import parse_args  # noqa: E402
from optimus_preflight.plotting.runs import Run, find_runs, label, load_run, swept_parameters  # noqa: E402

SCIENTIFIC = re.compile(r"\d[eE][+-]?\d|\$|\\times|×")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _write_run(directory: Path, records: list[dict[str, Any]], overrides: list[str] = ()) -> Path:
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    if overrides:
        (directory / ".hydra").mkdir()
        (directory / ".hydra" / "overrides.yaml").write_text("".join(f"- {item}\n" for item in overrides))
    return directory


def _records(lr: float, *, steps: int = 40, loss_offset: float = 0.0, val: bool = True) -> list[dict[str, Any]]:
    records = []
    for step in range(1, steps + 1):
        records.append({"step": step, "loss": loss_offset + 2.0 + 1.0 / step, "lr": lr, "grad_norm": 1.0 / step})
        if val and step % 10 == 0:
            records.append({"step": step, "val_loss": loss_offset + 2.1})
    return records


def _sweep(root: Path, lrs: list[float], **options: Any) -> tuple[list[Run], list[str]]:
    """Jobs whose curves coincide except for the LR itself, as a sweep dir on disk."""
    for number, lr in enumerate(lrs):
        _write_run(root / str(number), _records(lr, **options), [f"optimizer.lr={lr}", "trainer.max_steps=40"])
    kind, runs = find_runs(root)
    assert kind == "sweep"
    swept = swept_parameters(runs)
    return runs, [label(run, swept) for run in runs]


def _pixels(bbox: Bbox) -> float:
    return bbox.width * bbox.height


def _overlap(first: Bbox, second: Bbox) -> float:
    meet = Bbox.intersection(first, second)
    return 0.0 if meet is None else _pixels(meet)


def _legends(fig: Figure) -> list[Any]:
    return [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)


def _assert_legends_outside_axes(fig: Figure) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = _legends(fig)
    assert legends, "a sweep's figure names its runs"
    for legend in legends:
        for ax in fig.axes:
            assert _overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer)) == 0.0, ax.get_title()


def _data_lines(ax: Axes) -> list[Any]:
    return [line for line in ax.get_lines() if any(math.isfinite(float(v)) for v in line.get_ydata())]


def test_sweep_legend_sits_outside_every_axes(tmp_path):
    runs, labels = _sweep(tmp_path, [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2])
    figures = panel_figures(runs, labels)
    for _, fig in figures:
        _assert_legends_outside_axes(fig)
    assert [name for name, _ in figures] == ["loss", "val_loss", "lr", "grad_norm"]
    overview = overview_figure(runs, labels)
    _assert_legends_outside_axes(overview)
    assert len(overview.legends) == 1 and len(overview.legends[0].get_texts()) == len(runs)
    _assert_legends_outside_axes(final_vs_figure(runs, "optimizer.lr", ["optimizer.lr"]))


def test_runs_with_coinciding_curves_differ_in_line_style_as_well_as_colour(tmp_path):
    runs, labels = _sweep(tmp_path, [1e-3, 2e-3, 5e-3, 1e-2])  # loss and grad norm coincide
    figures = dict(panel_figures(runs, labels))
    for name in ("grad_norm", "loss"):  # a sweep's loss panel is train only: val has its own
        lines = figures[name].axes[0].get_lines()
        assert len({line.get_linestyle() for line in lines}) == len(runs), name
        assert len({tuple(line.get_color()) for line in lines}) == len(runs) == len(lines), name
    legend = figures["loss"].axes[0].get_legend()
    assert [text.get_text() for text in legend.get_texts()] == labels
    assert len({handle.get_linestyle() for handle in legend.legend_handles}) == len(runs)
    styles = run_styles(8)
    assert len({str(style.linestyle) for style in styles}) == 8 and len({style.color for style in styles}) == 8


def test_a_metric_without_points_gets_no_panel_and_no_blank_cell(tmp_path):
    records = []
    for step in range(1, 31):
        # grad norm logged but never finite (every step overflowed); no val_loss at all
        records.append({"step": step, "loss": 2.0 + 1.0 / step, "lr": 1e-3, "grad_norm": None, "nonfinite": {"grad_norm": "inf"}})
    run = load_run(_write_run(tmp_path / "run", records))
    assert [name for name, _ in panel_figures([run], [""])] == ["loss", "lr"]
    overview = overview_figure([run], [""])
    assert [ax.get_title() for ax in overview.axes] == ["loss", "learning rate"]
    assert all(ax.get_visible() and _data_lines(ax) for ax in overview.axes)
    runs, labels = _sweep(tmp_path / "sweep", [1e-3, 1e-2], val=False)  # a sweep's val panel too
    assert "val_loss" not in dict(panel_figures(runs, labels))
    assert "validation loss" not in [ax.get_title() for ax in overview_figure(runs, labels).axes]


def test_an_odd_number_of_panels_leaves_no_empty_axes(tmp_path):
    run = load_run(_write_run(tmp_path / "run", _records(1e-3, val=False)))  # loss, lr, grad norm
    overview = overview_figure([run], [""])
    assert [ax.get_title() for ax in overview.axes] == ["loss", "learning rate", "gradient norm"]
    assert all(ax.get_visible() and _data_lines(ax) for ax in overview.axes)


def test_lr_sweep_draws_the_learning_rate_on_a_log_axis(tmp_path):
    runs, labels = _sweep(tmp_path, [1e-3, 3e-3, 1e-2])  # one decade only
    assert dict(panel_figures(runs, labels))["lr"].axes[0].get_yscale() == "log"
    assert final_vs_figure(runs, "optimizer.lr", ["optimizer.lr"]).axes[0].get_xscale() == "log"


def test_one_runs_schedule_and_a_sweep_at_one_lr_stay_linear(tmp_path):
    warmup = [{"step": step, "loss": 2.0, "lr": 3e-3 * min(step / 100, 1.0)} for step in range(1, 301)]
    run = load_run(_write_run(tmp_path / "run", warmup))  # 3e-5 to 3e-3: two decades of warmup
    assert dict(panel_figures([run], [""]))["lr"].axes[0].get_yscale() == "linear"
    for number, batch in enumerate([16, 32]):
        _write_run(tmp_path / "sweep" / str(number), _records(1e-3), [f"data.batch_size={batch}"])
    _, runs = find_runs(tmp_path / "sweep")
    assert dict(panel_figures(runs, ["16", "32"]))["lr"].axes[0].get_yscale() == "linear"


def _assert_plain_ticks(fig: Figure) -> None:
    fig.canvas.draw()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            assert axis.get_offset_text().get_text() == "", (ax.get_title(), axis.get_offset_text().get_text())
            texts = [tick.get_text() for tick in axis.get_ticklabels() if tick.get_text()]
            assert texts, ax.get_title()
            assert not [text for text in texts if SCIENTIFIC.search(text)], (ax.get_title(), texts)


def test_tick_labels_are_plain_numbers_without_offset_or_exponent(tmp_path):
    # losses 1000.00x make matplotlib put "+1e3" in the corner; LRs of 1e-5 a "1e-5"
    records = [
        {"step": step, "loss": 1000.001 + step * 1e-5, "lr": 1e-5 + step * 1e-8, "grad_norm": 0.7 / step, "grad_scale": 2.0 ** (16 - step // 10)}
        for step in range(1, 61)
    ]
    run = load_run(_write_run(tmp_path / "run", records))
    for _, fig in panel_figures([run], [""]):
        _assert_plain_ticks(fig)
    _assert_plain_ticks(overview_figure([run], [""]))
    runs, labels = _sweep(tmp_path / "sweep", [1e-4, 1e-3, 1e-2])
    _assert_plain_ticks(dict(panel_figures(runs, labels))["lr"])
    lrs = [10 ** (-7 + i / 10) for i in range(60)]
    finder = {"lrs": lrs, "losses": [3.0 - i / 100 for i in range(60)], "smoothed": [3.0 - i / 100 for i in range(60)], "suggested_lr": 1e-4}
    _assert_plain_ticks(lr_finder_figure(finder, configured_lr=3e-4))


def test_plain_number_keeps_three_significant_digits():
    assert [plain_number(v) for v in (0.001, 0.0003, 0.5, 0.30000000000000004, 65536.0, 1e-8, 0.0, 12.345)] == [
        "0.001", "0.0003", "0.5", "0.3", "65536", "0.00000001", "0", "12.3"
    ]


def test_help_is_plain_text_without_restructuredtext_markup(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert not re.search(r"``|:func:|:class:|:meth:|`", out), out
    assert "optimus-plot" in out and "overview.png" in out
