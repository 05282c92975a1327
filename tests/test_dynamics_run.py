"""The healthy tiny recipe with dynamics on: the metrics land in metrics.jsonl and
TensorBoard, no warning fires, and optimus-plot draws the run; plus sweeps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from optimus_preflight.errors import UserError
from optimus_preflight.plotting.plot_cli import run as plot_cli
from optimus_preflight.recipes.char_lm import CharLMRecipe
from tests.conftest import tiny_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tiny_dynamics")
    cfg = tiny_config("logging.dynamics_every_n_steps=3", "logging.tensorboard=true", "trainer.eval_max_batches=2")
    CharLMRecipe(cfg, run_dir=run_dir).run()
    return run_dir


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_healthy_tiny_recipe_measures_every_n_steps_and_stays_quiet(tiny_run):
    train = [r for r in _records(tiny_run) if "loss" in r]
    measured = [r["step"] for r in train if "update_ratio/decay" in r]
    assert measured == list(range(3, 31, 3))
    assert all("skip_rate" in r and "update_ratio/no_decay" in r for r in train if r["step"] in measured)
    assert not any("update_ratio/decay" in r for r in train if r["step"] not in measured)
    assert not any("warnings" in r for r in train)
    assert all(1e-5 < r["update_ratio/decay"] < 1e-1 for r in train if r["step"] in measured)


def test_measuring_does_not_change_training(tiny_run, tmp_path):
    cfg = tiny_config("logging.dynamics_every_n_steps=0", "trainer.eval_max_batches=2")
    summary = CharLMRecipe(cfg, run_dir=tmp_path).run()
    assert summary["params_sha256"] == json.loads((tiny_run / "summary.json").read_text())["params_sha256"]


def test_histograms_and_dynamics_scalars_reach_tensorboard(tiny_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tiny_run / "tensorboard"), size_guidance={"histograms": 0, "scalars": 0}).Reload()
    histograms = events.Tags()["histograms"]
    assert "weights/token_embedding.weight" in histograms
    assert "grads/head.weight" in histograms
    assert "activations/blocks.0.mlp.1" in histograms  # the GELU
    assert [event.step for event in events.Histograms("weights/head.weight")] == list(range(3, 31, 3))
    assert "update_ratio/decay" in events.Tags()["scalars"]


def _assert_pngs(paths: list[Path]) -> None:
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000, path


def test_optimus_plot_draws_a_run(tiny_run, capsys):
    assert plot_cli([str(tiny_run)]) == 0
    out_dir = tiny_run / "plots"
    names = {path.name for path in out_dir.glob("*.png")}
    assert names == {"loss.png", "lr.png", "grad_norm.png", "update_ratio.png", "overview.png"}
    _assert_pngs(list(out_dir.glob("*.png")))
    printed = capsys.readouterr().out
    assert all(str(out_dir / name) in printed for name in names)


def _fake_job(directory: Path, lr: float, batch: int, final: float) -> None:
    directory.mkdir(parents=True)
    (directory / ".hydra").mkdir()
    (directory / ".hydra" / "overrides.yaml").write_text(f"- optimizer.lr={lr}\n- data.batch_size={batch}\n- trainer.max_steps=40\n")
    with open(directory / "metrics.jsonl", "w") as handle:
        for step in range(1, 41):
            record = {"step": step, "loss": final + 2.0 / step, "lr": lr, "grad_norm": 1.0 / step}
            if step % 10 == 0:
                record["update_ratio/decay"] = lr / 3
            handle.write(json.dumps(record) + "\n")
            if step % 20 == 0:
                handle.write(json.dumps({"step": step, "val_loss": final + 0.1}) + "\n")
    (directory / "summary.json").write_text(json.dumps({"status": "completed", "final_loss": final, "final_val_loss": final + 0.1}))


def test_optimus_plot_draws_a_sweep(tmp_path, capsys):
    sweep = tmp_path / "multirun"
    jobs = [(1e-4, 16, 2.0), (1e-3, 16, 1.5), (1e-2, 16, 1.8), (1e-4, 32, 1.9), (1e-3, 32, 1.4), (1e-2, 32, "nan")]
    for number, (lr, batch, final) in enumerate(jobs):
        _fake_job(sweep / str(number), lr, batch, float(final))
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    assert plot_cli([str(sweep)]) == 0
    names = {path.name for path in (sweep / "plots").glob("*.png")}
    assert {"loss.png", "lr.png", "update_ratio.png", "overview.png", "final_loss_vs_optimizer.lr.png", "final_loss_vs_data.batch_size.png"} <= names
    _assert_pngs(list((sweep / "plots").glob("*.png")))
    assert "sweep of 6 runs" in capsys.readouterr().out


def test_sweep_labels_name_only_the_swept_overrides(tmp_path):
    from optimus_preflight.plotting.runs import find_runs, label, swept_parameters

    _fake_job(tmp_path / "0", 1e-3, 16, 1.0)
    _fake_job(tmp_path / "1", 1e-2, 16, 1.0)
    kind, runs = find_runs(tmp_path)
    assert kind == "sweep" and swept_parameters(runs) == ["optimizer.lr"]
    assert [label(run, ["optimizer.lr"]) for run in runs] == ["optimizer.lr=0.001", "optimizer.lr=0.01"]


def test_optimus_plot_without_matplotlib_exits_2_naming_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "optimus_preflight.plotting.figures", None)
    assert plot_cli([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install matplotlib" in err


def test_optimus_plot_rejects_a_dir_without_metrics(tmp_path, capsys):
    assert plot_cli([str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    assert plot_cli([str(tmp_path / "missing")]) == 2


def test_dynamics_interval_is_validated_and_zero_disables():
    with pytest.raises(UserError, match="logging.dynamics_every_n_steps must be >= 0"):
        CharLMRecipe(tiny_config("logging.dynamics_every_n_steps=-1"))
    assert tiny_config().logging.dynamics_every_n_steps == 50
    assert tiny_config().preflight.lr_finder is False


def test_series_keeps_the_last_value_of_a_relogged_step_and_reads_non_finite_text(tmp_path):
    from optimus_preflight.plotting.runs import load_run

    lines = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}, {"step": 2, "loss": 2.5}, {"step": 3, "loss": "nan"}, {"step": 3, "val_loss": 2.2}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n{\"step\": 4, \"lo")
    run = load_run(tmp_path)
    steps, values = run.series("loss")
    assert steps == [1, 2, 3] and values[:2] == [3.0, 2.5] and values[2] != values[2]
    assert run.final("val_loss") == 2.2
