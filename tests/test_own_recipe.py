"""A user's own recipe through the command line (tests/shapes_cnn_recipe.py, written from
the README): its config, its defaults, its metrics, best checkpoint, early stopping,
test loader, sweeps and a bit-exact resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from optimus_preflight import compose
from tests.conftest import REPO, run_cli
from tests.shapes_cnn_recipe import ShapesCNN

SHAPES = ("recipe._target_=tests.shapes_cnn_recipe.ShapesCNN", "logging.progress=none")
QUIET = (*SHAPES, "preflight.enabled=false")


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_recipe_declares_its_config_and_nothing_of_the_char_lm():
    cfg = ShapesCNN.compose(["model.width=8"])
    assert cfg.model.width == 8 and cfg.model.dropout == 0.0
    assert set(cfg.data) == {"batch_size", "samples", "image_size", "seed", "num_workers"}
    assert cfg.trainer.max_epochs == 3 and cfg.trainer.max_steps is None  # its config_defaults
    assert cfg.optimizer.lr == 0.01
    assert "vocab_size" not in json.dumps(dict(cfg.model)) and "stdlib" not in str(cfg.data)
    # The same through recipe._target_, as the CLI composes it.
    assert compose(["recipe._target_=tests.shapes_cnn_recipe.ShapesCNN"]).model.width == 16


def test_a_recipe_that_declares_nothing_gets_neutral_defaults():
    from tests.test_custom_recipe import BlobsRecipe

    cfg = BlobsRecipe.compose(["trainer.max_steps=10"])
    assert cfg.optimizer.lr == 1e-3 and cfg.optimizer.weight_decay == 0.01
    assert cfg.scheduler.warmup_steps == 0 and cfg.trainer.clip_grad_norm is None
    assert cfg.trainer.eval_max_batches is None and cfg.trainer.precision == "auto"
    assert dict(cfg.model) == {} and cfg.data.train is None


@pytest.mark.slow
def test_cfg_job_and_keys_through_the_cli(tmp_path):
    shown = run_cli(tmp_path / "a", *SHAPES, "--cfg=job", "model.width=8")
    assert shown.returncode == 0, shown.output
    job = yaml.safe_load(shown.stdout)
    assert job["model"] == {"width": 8, "dropout": 0.0} and "vocab_size" not in shown.stdout
    typo = run_cli(tmp_path / "b", *QUIET, "model.widht=8")
    assert typo.returncode == 2 and "Did you mean model.width?" in typo.stderr and "Traceback" not in typo.output
    foreign = run_cli(tmp_path / "c", *QUIET, "model.n_layer=12")
    assert foreign.returncode == 2 and "model.n_layer" in foreign.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


@pytest.mark.slow
def test_an_override_nothing_reads_is_refused_and_a_sweep_over_it_runs_nothing(tmp_path):
    result = run_cli(tmp_path / "run", *QUIET, "data.num_workers=2")
    assert result.returncode == 2, result.output
    assert "data.num_workers is set, but ShapesCNN.build_dataloaders does not read cfg.data.num_workers" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run" / "metrics.jsonl").exists()
    sweep = run_cli(tmp_path / "unused", "-m", *QUIET, f"hydra.sweep.dir={tmp_path / 'sweep'}", "data.num_workers=0,2")
    assert sweep.returncode == 2, sweep.output
    assert not list((tmp_path / "sweep").glob("*/metrics.jsonl"))


@pytest.mark.slow
def test_metrics_best_checkpoint_test_loader_and_a_bit_exact_resume_after_ctrl_c(tmp_path):
    watch = ("checkpoint.monitor=val_acc", "checkpoint.mode=max", "logging.every_n_steps=4", "logging.csv=true")
    whole = run_cli(tmp_path / "whole", *SHAPES, *watch)
    assert whole.returncode == 0, whole.output
    summary = whole.summary()
    assert summary["steps"] == 48 and summary["epoch"] == 2  # 3 epochs of 16 steps
    assert summary["test"]["test_acc"] > 0.9 and 0 <= summary["metrics"]["val_acc"] <= 1
    best = summary["best_checkpoint"]
    assert best["metric"] == "val_acc" and (tmp_path / "whole" / "checkpoints" / "best" / "manifest.json").exists()
    records = _records(tmp_path / "whole")
    steps = [r for r in records if "loss" in r]
    assert all("acc" in r and "epoch" in r for r in steps)
    assert [r["step"] for r in records if "val_acc" in r] == [16, 32, 48]  # once per epoch
    assert "acc" in (tmp_path / "whole" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert (tmp_path / "whole" / "model_summary.txt").read_text().splitlines()[-1].startswith("total")

    stopped = run_cli(tmp_path / "cut", *SHAPES, *watch, env={"SHAPES_SIGNAL_AT": "23"})
    assert stopped.returncode == 130, stopped.output
    resumed = run_cli(tmp_path / "cut", *SHAPES, *watch)
    assert resumed.returncode == 0, resumed.output
    again = resumed.summary()
    assert again["params_sha256"] == summary["params_sha256"]
    assert again["best_checkpoint"]["step"] == best["step"] and again["best_checkpoint"]["value"] == best["value"]
    assert again["metrics"] == summary["metrics"]
    cut = _records(tmp_path / "cut")
    assert [r["step"] for r in cut if "loss" in r] == [r["step"] for r in steps]
    assert [r["loss"] for r in cut if "loss" in r] == [r["loss"] for r in steps]

    tested = run_cli(tmp_path / "test_only", *QUIET, "trainer.test_only=true",
                     f"checkpoint.resume={tmp_path / 'whole' / 'checkpoints' / 'best'}")
    assert tested.returncode == 0, tested.output
    assert tested.summary()["test"]["test_acc"] > 0.9 and not (tmp_path / "test_only" / "checkpoints").exists()


@pytest.mark.slow
def test_early_stopping_ends_the_run_cleanly_with_its_reason(tmp_path):
    result = run_cli(tmp_path / "run", *QUIET, "trainer.eval_every_n_steps=2", "trainer.early_stopping.monitor=val_acc",
                     "trainer.early_stopping.mode=max", "trainer.early_stopping.patience=2", "optimizer.lr=1e-6")
    assert result.returncode == 0, result.output
    summary = result.summary()
    assert summary["status"] == "completed" and summary["steps"] < 48
    assert summary["stop_reason"].startswith("early stopping: val_acc did not improve")
    wrong = run_cli(tmp_path / "wrong", *QUIET, "checkpoint.monitor=val_accuracy")
    assert wrong.returncode == 2 and "checkpoint.monitor='val_accuracy'" in wrong.output and "val_acc" in wrong.output
    assert wrong.summary()["steps"] == 0  # found before the first step, not at the first evaluation


@pytest.mark.slow
def test_a_sweep_of_the_recipe_and_its_metric_in_the_sweep_summary(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_cli(tmp_path / "unused", "-m", *QUIET, f"hydra.sweep.dir={sweep}", "model.width=4,8")
    assert result.returncode == 0, result.output
    widths = [yaml.safe_load((job / ".hydra" / "config.yaml").read_text())["model"]["width"] for job in sorted(sweep.glob("[0-9]"))]
    assert widths == [4, 8]
    assert "val_acc" in (sweep / "summary.md").read_text()
    assert "recipe_defaults" not in (sweep / "summary.md").read_text()


@pytest.mark.slow
def test_python_my_recipe_py_and_version_and_help(tmp_path):
    run = subprocess.run([sys.executable, "tests/shapes_cnn_recipe.py", f"hydra.run.dir={tmp_path / 'run'}",
                          "logging.progress=none", "preflight.enabled=false", "trainer.max_epochs=1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 16
    version = run_cli(tmp_path / "v", "--version")
    assert version.returncode == 0 and version.stdout.startswith("optimus-train 0.1.0 (torch ")
    shown = run_cli(tmp_path / "h", *SHAPES, "--help")
    assert shown.returncode == 0, shown.output
    assert "model.width = 16" in shown.stdout and "Channels of the convolution." in shown.stdout
    assert "trainer.max_epochs = 3" in shown.stdout and "vocab_size" not in shown.stdout


PRESET = """# @package _global_
recipe:
  _target_: tests.shapes_cnn_recipe.ShapesCNN
model:
  width: 6
trainer:
  max_epochs: 1
"""


PRIMARY = """defaults:
  - config
  - _self_
hydra:
  searchpath:
    - pkg://optimus_preflight.conf
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["config-dir", "searchpath", "config-path"])
def test_a_users_own_preset_beside_the_project(tmp_path, how):
    presets = tmp_path / "my_conf"
    (presets / "recipe").mkdir(parents=True)
    (presets / "recipe" / "cnn_small.yaml").write_text(PRESET)
    (presets / "mine.yaml").write_text(PRIMARY)  # --config-path: the user's own primary config on ours
    where = {"config-dir": [f"--config-dir={presets}"], "searchpath": [f"hydra.searchpath=[file://{presets}]"],
             "config-path": [f"--config-path={presets}", "--config-name=mine"]}[how]
    result = run_cli(tmp_path / "run", *where, "recipe=cnn_small", "logging.progress=none", "preflight.enabled=false",
                     "model.dropout=0.1", cwd=REPO)
    assert result.returncode == 0, result.output
    saved = yaml.safe_load((tmp_path / "run" / ".hydra" / "config.yaml").read_text())
    assert saved["model"] == {"width": 6, "dropout": 0.1} and saved["trainer"]["max_epochs"] == 1
    missing = run_cli(tmp_path / "bad", *where, "recipe=cnn_big", cwd=REPO)
    assert missing.returncode == 2 and "cnn_small" in missing.stderr


@pytest.mark.slow
def test_csv_mlflow_and_wandb_receive_the_config_metrics_and_summary(tmp_path):
    store = tmp_path / "mlruns"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path), "MLFLOW_ALLOW_FILE_STORE": "true"}
    result = run_cli(tmp_path / "run", *QUIET, "trainer.max_epochs=1", "logging.csv=true", "logging.mlflow.enabled=true",
                     f"logging.mlflow.tracking_uri=file://{store}", "logging.wandb.enabled=true", env=env)
    assert result.returncode == 0, result.output
    assert "val_acc" in (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0]
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    check = subprocess.run([sys.executable, "-c", f"""
from mlflow.tracking import MlflowClient
client = MlflowClient("file://{store}")
[run] = client.search_runs([client.get_experiment_by_name("ShapesCNN").experiment_id])
print(run.info.status, run.data.params["model.width"], [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")],
      "final/metrics.test_acc" in run.data.metrics)
"""], capture_output=True, text=True, env={**__import__("os").environ, **env}, timeout=120)
    assert check.stdout.split() == ["FINISHED", "16", "[16]", "True"], check.stderr


@pytest.mark.slow
def test_the_readme_example_runs_as_printed(tmp_path):
    readme = (REPO / "README.md").read_text()
    start = readme.index("```python\n# shapes_cnn.py\n") + len("```python\n")
    (tmp_path / "shapes_cnn.py").write_text(readme[start : readme.index("```", start)])
    run = subprocess.run([sys.executable, "shapes_cnn.py", "hydra.run.dir=run", "logging.progress=none",
                          "trainer.max_epochs=1", "checkpoint.monitor=val_acc", "checkpoint.mode=max"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["best_checkpoint"]["metric"] == "val_acc" and "test_acc" in summary["test"]
    unread = subprocess.run([sys.executable, "shapes_cnn.py", "hydra.run.dir=run2", "model.n_layer=12"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert unread.returncode == 2 and "model.n_layer" in unread.stderr
