"""optimus-plot reads any metrics.jsonl a run or a crash can leave, and draws a long run
from a bounded number of points that keeps its spikes (issue 29, part C)."""

from __future__ import annotations

import json
import math
import random

import pytest

pytest.importorskip("matplotlib")

from optimus_preflight.plotting.plot_cli import run as plot_cli  # noqa: E402
from optimus_preflight.plotting.runs import load_run, parse_record  # noqa: E402
from optimus_preflight.plotting.series import MAX_POINTS, downsample, smooth  # noqa: E402

DAMAGED_LINES = [
    b'{"step": 3, "loss": 1.0, "note": "\xff\xfe"}',  # not UTF-8
    b"[1, 2, 3]",  # JSON, not an object
    b'"a string"',
    b'{"step": 4, "loss": ' + b"9" * 5_000_000 + b"}",  # a 5 MB number
    b'{"step": "four", "loss": 1.0}',  # a step that is not a number
    b'{"step": 5, "lo',  # cut short by a kill
]
ODD_VALUES = [
    b'{"step": 6, "loss": "abc"}',  # a value that is not a number: the record stays, the value does not draw
    b'{"step": 7, "loss": [1, 2]}',
    b'{"step": 8, "loss": ' + b"9" * 4000 + b"}",  # an integer too large for a float
    b'{"step": 9, "loss": 0.5, "warnings": "not a list"}',
]


def _write_run(path, lines: list[bytes]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    good = [json.dumps({"step": step, "loss": 2.0 / step, "lr": 1e-3}).encode() for step in range(10, 60)]
    (path / "metrics.jsonl").write_bytes(b"\n".join(good[:25] + lines + good[25:]) + b"\n")
    (path / "summary.json").write_bytes(b'{"status": "comp')  # a summary cut short too


@pytest.mark.parametrize("line", DAMAGED_LINES)
def test_a_line_that_is_not_a_record_is_skipped(line):
    assert parse_record(line) is None


def test_a_damaged_metrics_file_plots_and_says_how_many_lines_it_skipped(tmp_path, capsys):
    _write_run(tmp_path / "run", DAMAGED_LINES + ODD_VALUES)
    run = load_run(tmp_path / "run")
    assert run.skipped == len(DAMAGED_LINES)
    steps, values = run.series("loss")
    assert 9 in steps and not {6, 7, 8} & set(steps)
    assert plot_cli([str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert f"skipped {len(DAMAGED_LINES)} line(s)" in err and "metrics.jsonl" in err
    assert (tmp_path / "run" / "plots" / "loss.png").stat().st_size > 0


def test_a_file_of_nothing_but_damaged_lines_is_a_user_error(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_bytes(b"\n".join(DAMAGED_LINES))
    assert plot_cli([str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "no metrics.jsonl with records" in err


def test_downsampling_bounds_the_points_and_keeps_every_extreme():
    rng = random.Random(0)
    count = 400_000
    steps = list(range(count))
    values = [1.0 + rng.random() for _ in steps]
    values[123_457] = 50.0  # a one-step spike
    values[300_001] = -7.0  # a one-step dip
    for index in range(200_000, 200_500):
        values[index] = math.nan  # a stretch of non-finite losses
    x, y = downsample(steps, values)
    assert len(x) <= 2 * MAX_POINTS
    assert list(x) == sorted(x)
    points = dict(zip(x, y))
    assert points[123_457] == 50.0 and points[300_001] == -7.0
    assert max(y[~_isnan(y)]) == 50.0 and min(y[~_isnan(y)]) == -7.0
    assert any(200_000 <= step < 200_500 and math.isnan(value) for step, value in points.items())  # the gap stays


def _isnan(array):
    import numpy as np

    return np.isnan(array)


def test_a_short_series_is_drawn_as_it_is():
    steps, values = list(range(100)), [float(v) for v in range(100)]
    assert downsample(steps, values) == (steps, values)


def _smooth_reference(values: list[float]) -> list[float]:
    """The definition: a centred window mean over the finite values."""
    half = max(len(values) // 30, 1)
    out = []
    for index in range(len(values)):
        window = [v for v in values[max(0, index - half): index + half + 1] if math.isfinite(v)]
        out.append(sum(window) / len(window) if window else float("nan"))
    return out


@pytest.mark.parametrize("count", [1, 5, 31, 200, 1000])
def test_smoothing_is_the_centred_window_mean_of_the_finite_values(count):
    rng = random.Random(count)
    values = [rng.gauss(0, 1) if rng.random() > 0.1 else math.nan for _ in range(count)]
    expected, got = _smooth_reference(values), smooth(values)
    assert len(got) == count
    for want, have in zip(expected, got):
        assert (math.isnan(want) and math.isnan(have)) or have == pytest.approx(want, abs=1e-9)


def test_a_long_run_plots_with_its_spike_on_the_loss_panel(tmp_path):
    run_dir = tmp_path / "long"
    run_dir.mkdir()
    lines = [json.dumps({"step": step, "loss": 50.0 if step == 30_000 else 1.0 + 1.0 / step, "lr": 1e-3})
             for step in range(1, 60_001)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert plot_cli([str(run_dir)]) == 0
    import matplotlib.pyplot as plt

    from optimus_preflight.plotting.figures import draw_loss, run_styles

    figure, ax = plt.subplots()
    draw_loss(ax, [load_run(run_dir)], run_styles(1))
    drawn = [line for line in ax.get_lines() if len(line.get_xdata()) > 0]
    assert all(len(line.get_xdata()) <= 2 * MAX_POINTS for line in drawn)
    assert any(50.0 in list(line.get_ydata()) for line in drawn)  # the raw trace keeps the spike
    plt.close(figure)
