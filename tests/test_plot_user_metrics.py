"""optimus-plot draws a recipe's own metrics (``self.log``): a panel per metric with its
train, val and test values together, beside the built-in panels. Runs are metrics.jsonl
files written by hand (as tests/test_plots.py does), so nothing here trains."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

pytest.importorskip("matplotlib")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from optimus_preflight.callbacks.compile_watch import CompileWatchCallback
from optimus_preflight.plotting.figures import PANELS, overview_figure, panel_figures, plot_run  # noqa: E402
from optimus_preflight.plotting.plot_cli import run as plot_cli  # noqa: E402
from optimus_preflight.plotting.runs import find_runs, is_builtin, label, load_run, swept_parameters, user_metrics  # noqa: E402
from optimus_preflight.plotting.user_panels import MAX_USER_PANELS  # noqa: E402
from optimus_preflight.reporting.progress import Progress  # noqa: E402
from optimus_preflight.reporting.sinks import MetricsLogger  # noqa: E402
from optimus_preflight.reporting.step_log import StepLogger  # noqa: E402
from optimus_preflight.training.step import StepResult  # noqa: E402
from optimus_preflight.training.user_metrics import MetricCollector  # noqa: E402
from tests.test_plots import _write_run  # noqa: E402

BUILTIN_TITLES = {title for _, title, _ in PANELS}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _records(*, steps: int = 40, offset: float = 0.0, extra: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Every built-in key a run writes, a recipe's ``acc`` (train, val, test) and a
    ``val_bleu`` that has no training counterpart."""
    records = []
    for step in range(1, steps + 1):
        record = {
            "step": step, "epoch": step // 20, "loss": 2.0 + 1.0 / step + offset, "lr": 1e-3, "lr/decay": 1e-3, "lr/no_decay": 5e-4,
            "grad_norm": 1.0 / step, "skipped_steps": 0, "grad_scale": 65536.0, "samples_per_s": 120.0 + step,
            "time/data_ms": 1.5, "time/forward_ms": 3.0, "memory/host_rss_bytes": 2**30, "acc": 0.5 + step / 100 + offset,
            **(extra or {}),
        }
        if step == 1:
            record["compile_warmup_s"] = 4.2
        if step % 10 == 0:
            record.update({"update_ratio/decay": 1e-3, "dead_fraction/mlp": 0.1, "skip_rate": 0.0})
        records.append(record)
        if step % 10 == 0:
            records.append({"step": step, "val_loss": 2.1 + offset, "val_acc": 0.45 + step / 100 + offset, "val_bleu": step / 100})
    records.append({"step": steps, "test_loss": 2.2 + offset, "test_acc": 0.8 + offset, "test_bleu": 0.35})
    return records


def _axes_by_title(fig) -> dict[str, Any]:
    return {ax.get_title(): ax for ax in fig.axes}


def _finite_lines(ax) -> list[Any]:
    return [line for line in ax.get_lines() if any(math.isfinite(float(v)) for v in line.get_ydata())]


def test_the_cli_writes_a_panel_per_recipe_metric_and_adds_them_to_the_overview(tmp_path, capsys):
    run_dir = _write_run(tmp_path / "run", _records())
    assert plot_cli([str(run_dir)]) == 0
    plots = run_dir / "plots"
    written = sorted(path.name for path in plots.glob("*.png"))
    for name in ("acc.png", "val_bleu.png", "overview.png", "loss.png"):
        assert name in written and (plots / name).stat().st_size > 0, written
    # built-ins keep their own panels (or none), and a test value only joins a panel
    assert not {"val_acc.png", "test_acc.png", "samples_per_s.png", "time_data_ms.png", "epoch.png", "test_bleu.png"} & set(written)
    assert "acc.png" in capsys.readouterr().out

    run = load_run(run_dir)
    names = [name for name, _ in panel_figures([run], [""])]
    assert names == ["loss", "lr", "grad_norm", "grad_scale", "update_ratio", "dead_fraction", "acc", "val_bleu"]
    overview = overview_figure([run], [""])
    titles = [ax.get_title() for ax in overview.axes]
    assert [title for title in titles if title not in BUILTIN_TITLES] == ["acc", "val_bleu"]
    assert all(_finite_lines(ax) for ax in overview.axes)


def test_train_val_and_test_values_of_a_metric_share_its_panel(tmp_path):
    run = load_run(_write_run(tmp_path / "run", _records()))
    figures = dict(panel_figures([run], [""]))
    acc = figures["acc"].axes[0]
    assert acc.get_title() == "acc" and acc.get_ylabel() == "acc"
    assert [text.get_text() for text in acc.get_legend().get_texts()] == ["train", "val", "test"]
    lines = _finite_lines(acc)
    val = [line for line in lines if line.get_linestyle() == "--"]
    assert len(val) == 1 and list(val[0].get_xdata()) == [10, 20, 30, 40]
    test = [line for line in lines if line.get_marker() == "*"]
    assert len(test) == 1 and (list(test[0].get_xdata()), list(test[0].get_ydata())) == ([40], [0.8])
    # an evaluation-only metric: its own panel, and its test value joins it
    bleu = figures["val_bleu"].axes[0]
    assert bleu.get_title() == "val_bleu"
    assert [line.get_marker() for line in _finite_lines(bleu)] == ["o", "*"]
    # the built-in test loss joins the loss panel the same way
    assert [text.get_text() for text in figures["loss"].axes[0].get_legend().get_texts()] == ["train", "val", "test"]


def test_a_sweep_gets_one_panel_per_metric_with_every_run_on_it(tmp_path):
    for number, lr in enumerate([1e-3, 1e-2, 1e-1]):
        extra = {"perplexity": 7.0} if number == 1 else None  # logged by one job only
        _write_run(tmp_path / str(number), _records(offset=0.1 * number, extra=extra), [f"optimizer.lr={lr}"])
    kind, runs = find_runs(tmp_path)
    assert kind == "sweep"
    swept = swept_parameters(runs)
    labels = [label(run, swept) for run in runs]
    figures = dict(panel_figures(runs, labels))
    assert {"acc", "val_bleu", "perplexity"} <= set(figures)
    acc = figures["acc"].axes[0]
    assert [text.get_text() for text in acc.get_legend().get_texts()] == [*labels, "train", "val", "test"]
    assert len([line for line in _finite_lines(acc) if line.get_marker() == "*"]) == len(runs)
    assert len(_finite_lines(figures["perplexity"].axes[0])) == 1
    overview = overview_figure(runs, labels)
    assert {"acc", "val_bleu", "perplexity"} <= {ax.get_title() for ax in overview.axes}
    assert len(overview.legends) == 1  # the run legend, once


def test_at_most_twelve_metric_panels_and_the_rest_are_named_in_a_warning(tmp_path, caplog):
    extra = {f"m{index:02d}": float(index) for index in range(MAX_USER_PANELS + 3)}
    run_dir = _write_run(tmp_path / "run", _records(extra=extra))
    run = load_run(run_dir)
    metrics = [metric.title for metric in user_metrics([run])]
    assert len(metrics) == MAX_USER_PANELS + 5  # acc, val_bleu and the 15 m's
    with caplog.at_level(logging.WARNING):
        written = plot_run(run, run_dir / "plots")
    user_files = [path.stem for path in written if path.stem not in {name for name, _, _ in PANELS} | {"overview"}]
    assert user_files == metrics[:MAX_USER_PANELS]
    left_out = metrics[MAX_USER_PANELS:]
    assert [record for record in caplog.records if all(name in record.getMessage() for name in left_out)]


def test_metric_names_become_safe_file_names_that_clobber_nothing(tmp_path):
    extra = {"overview": 1.0, "loss_scale": 2.0, "acc/top-1 (%)": 3.0, "../escape": 4.0, "Acc": 5.0, "final_loss_vs_x": 6.0}
    run_dir = _write_run(tmp_path / "run", _records(extra=extra))
    written = plot_run(load_run(run_dir), run_dir / "plots")
    assert all(path.parent == run_dir / "plots" and path.stat().st_size > 0 for path in written)
    names = [path.name for path in written]
    assert len({name.lower() for name in names}) == len(names)  # distinct even where case is not
    assert names.count("overview.png") == 1 and "overview_metric.png" in names
    assert {"acc_top-1____.png", "loss_scale.png", "_escape.png", "metric_final_loss_vs_x.png"} <= set(names)
    assert not list(tmp_path.glob("*.png")) and not list((run_dir / "plots").glob("*/*"))


def test_every_key_the_step_logger_writes_is_built_in_and_the_recipes_are_not():
    """The built-in list is checked against what the toolkit writes, not guessed."""

    class Sink:
        def __init__(self) -> None:
            self.records: list[dict[str, Any]] = []

        def write(self, record: dict[str, Any]) -> None:
            self.records.append(record)

        def close(self) -> None:
            pass

    class EnabledScaler:  # grad_scale is logged under fp16 only
        def is_enabled(self) -> bool:
            return True

        def get_scale(self) -> float:
            return 1024.0

    sink = Sink()
    watch = CompileWatchCallback()  # the compile warm-up's key, as the recipe's callback adds it
    watch.start(1)
    watch.on_step_start(None, 1)
    logger = StepLogger(MetricsLogger([sink]), Progress("none", 10), every_n_steps=1, device=torch.device("cpu"),
                        scaler=EnabledScaler(), group_names=["decay", "no_decay"],
                        extend_record=lambda step, result, record: watch.on_step_record(None, step, result, record))
    collector = MetricCollector()
    collector.start_step()
    collector.log("acc", torch.tensor(0.5))
    collector.end_step()
    result = StepResult(loss=torch.tensor(2.0), grad_norm=torch.tensor(1.0), stepped=True, lrs=[1e-3, 5e-4], samples=4, micro_batches=1)
    logger.on_step(1, result, 0, epoch=0, user_metrics=collector)
    logger.on_step(2, result, 0, epoch=0, user_metrics=collector, force=True)
    logger.on_eval(2, {"val_loss": 2.0, "val_acc": 0.4})
    logger.on_eval(2, {"test_loss": 2.0, "test_acc": 0.4})
    keys = set().union(*sink.records)
    assert {"samples_per_s", "compile_warmup_s", "grad_scale", "lr/decay", "epoch"} <= keys
    assert {key for key in keys if not is_builtin(key)} == {"acc", "val_acc", "test_acc"}
