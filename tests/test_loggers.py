"""metrics.csv, MLflow and W&B sinks, against the real packages (MLflow's local file store,
W&B offline), read back from what they wrote."""

from __future__ import annotations

import csv
import json
import logging
import os
import struct
import sys
import time
from pathlib import Path

import pytest

from optimus_preflight.config.schema import LoggingConfig
from optimus_preflight.errors import UserError
from optimus_preflight.reporting.loggers import CsvSink, MLflowSink, WandbSink, make_logger_sinks

ALLOW_FILE_STORE_AT_IMPORT = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
CONFIG = {"optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.99]}, "trainer": {"max_steps": 4}, "seed": 0}


def train(step: int, loss: float) -> dict:
    return {"step": step, "epoch": 0, "loss": loss, "lr": 1e-3, "time/data_ms": 1.5, "phase": "train"}


def strict_rows(path: Path) -> list[dict[str, str]]:
    """The file's rows, after checking every row has as many fields as the header."""
    with open(path, newline="", encoding="utf-8") as handle:
        table = list(csv.reader(handle))
    assert table and all(len(row) == len(table[0]) for row in table), table
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# ---------------------------------------------------------------- CSV


def test_csv_grows_columns_and_stays_valid(tmp_path):
    path = tmp_path / "metrics.csv"
    sink = CsvSink(path, flush_every_s=0.0)
    sink.write(train(1, 2.0))
    assert strict_rows(path)[0]["loss"] == "2.0"
    sink.write({"step": 2, "val_acc": 0.5})  # eval record: a new column
    sink.write(train(2, 1.5))
    sink.write({**train(3, 1.0), "user/metric": 7, "extra": {"a": 1}})  # a metric that appears late
    rows = strict_rows(path)  # valid while the sink is still open
    assert [row["step"] for row in rows] == ["1", "2", "2", "3"]
    sink.finish({"loss": 1.0}, "completed")
    sink.close()
    sink.close()

    rows = strict_rows(path)
    header = path.read_text().splitlines()[0].split(",")
    assert header[0] == "step" and header[-3:] == ["val_acc", "user/metric", "extra"]
    assert rows[0]["val_acc"] == "" and rows[1]["val_acc"] == "0.5" and rows[1]["loss"] == ""
    assert rows[3]["user/metric"] == "7" and json.loads(rows[3]["extra"]) == {"a": 1}
    assert rows[2]["time/data_ms"] == "1.5" and rows[2]["phase"] == "train"
    assert sink.resume_id() is None


def test_csv_buffers_whole_rows_until_flush(tmp_path):
    path = tmp_path / "metrics.csv"
    sink = CsvSink(path, flush_every_s=3600)
    sink.write(train(1, 2.0))  # the first row writes the header
    sink.write(train(2, 1.0))
    assert len(strict_rows(path)) == 1
    sink.flush()
    assert len(strict_rows(path)) == 2
    sink.close()


def test_csv_resume_drops_later_rows_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.csv"
    sink = CsvSink(path)
    for step in range(1, 11):
        sink.write(train(step, 1.0 / step))
    sink.write({"step": 10, "val_acc": 0.9})
    sink.close()
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("11,0,0.0")  # a row a kill cut short

    sink = CsvSink(path, after_step=6)
    assert [row["step"] for row in strict_rows(path)] == [str(step) for step in range(1, 7)]
    for step in (7, 8):
        sink.write(train(step, 0.1))
    sink.close()
    rows = strict_rows(path)
    assert [row["step"] for row in rows] == [str(step) for step in range(1, 9)]
    assert "val_acc" in rows[0]  # the header keeps the columns of the dropped rows


def test_csv_close_never_raises(tmp_path, caplog):
    sink = CsvSink(tmp_path / "metrics.csv")
    sink.write(train(1, 1.0))
    sink.write(train(2, 1.0))

    class Broken:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def close(self):
            raise OSError(28, "No space left on device")

    sink._file = Broken()
    with caplog.at_level(logging.ERROR):
        sink.close()
    assert "could not be written" in caplog.text


# ---------------------------------------------------------------- MLflow


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """The default store: mlruns/ in the working directory."""
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 refuses the file store without it
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((metric.step, metric.value) for metric in client.get_metric_history(run_id, key))


def test_mlflow_params_metrics_summary(mlflow_store, tmp_path):
    config = {**CONFIG, "data": {"path": "x" * 800, "bad:key@": 1}, "many": {f"k{i}": i for i in range(150)}}
    sink = MLflowSink(experiment="CharLM", run_name="run-a", config=config, group="sweep-7")
    sink.write(train(1, 2.0))
    sink.write(train(2, 1.5))
    sink.write({"step": 2, "val_acc": 0.75})
    sink.finish({"final_loss": 1.5, "verdict": "ok", "eval": {"val_acc": 0.75}, "ok": True, "issues": ["a"]},
                "completed")
    sink.close()

    assert (tmp_path / "mlruns").is_dir()
    run = mlflow_store.get_run(sink.run_id)
    assert sink.resume_id() == sink.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    assert mlflow_store.get_experiment(run.info.experiment_id).name == "CharLM"
    params = run.data.params
    assert params["optimizer.lr"] == "0.001" and params["optimizer.name"] == "adamw"
    assert params["optimizer.betas"] == "[0.9, 0.99]" and params["trainer.max_steps"] == "4"
    assert params["data.path"] == "x" * 500 and params["data.bad_key_"] == "1"
    assert sum(key.startswith("many.") for key in params) == 150  # more than one batch of 100
    assert history(mlflow_store, sink.run_id, "loss") == [(1, 2.0), (2, 1.5)]
    assert history(mlflow_store, sink.run_id, "time/data_ms") == [(1, 1.5), (2, 1.5)]
    assert history(mlflow_store, sink.run_id, "val_acc") == [(2, 0.75)]
    assert "phase" not in run.data.metrics and "epoch" in run.data.metrics
    assert run.data.metrics["final/final_loss"] == 1.5 and run.data.metrics["final/eval.val_acc"] == 0.75
    tags = run.data.tags
    assert tags["sweep"] == "sweep-7" and tags["final/verdict"] == "ok" and tags["final/ok"] == "True"
    assert tags["optimus.status"] == "completed" and "final/issues" not in tags
    artifact = Path(run.info.artifact_uri.removeprefix("file://")) / "config.json"
    assert json.loads(artifact.read_text())["optimizer"]["lr"] == 1e-3


@pytest.mark.parametrize(
    ("status", "expected"),
    [("interrupted", "KILLED"), ("failed", "FAILED"), ("preflight_failed", "FAILED"), (None, "FAILED")],
)
def test_mlflow_run_status(mlflow_store, status, expected):
    sink = MLflowSink(experiment="CharLM", run_name="r", config=CONFIG)
    if status is not None:  # None: closed without a finish
        sink.finish({}, status)
    sink.close()
    run = mlflow_store.get_run(sink.run_id)
    assert run.info.status == expected
    assert run.data.tags["optimus.status"] == (status or "failed")


def test_mlflow_resume_continues_the_run(mlflow_store, caplog):
    first = MLflowSink(experiment="CharLM", run_name="r", config=CONFIG)
    for step in (1, 2, 3):
        first.write(train(step, 1.0))
    first.finish({}, "interrupted")
    first.close()

    changed = {**CONFIG, "trainer": {"max_steps": 8}}
    with caplog.at_level(logging.WARNING):
        second = MLflowSink(experiment="CharLM", run_name="r", config=changed, resume_run_id=first.run_id)
    assert second.run_id == first.run_id
    assert "trainer.max_steps" in caplog.text
    assert mlflow_store.get_run(second.run_id).info.status == "RUNNING"
    for step in (4, 5):
        second.write(train(step, 0.5))
    second.finish({"final_loss": 0.5}, "completed")
    second.close()
    run = mlflow_store.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.params["trainer.max_steps"] == "4"
    assert [step for step, _ in history(mlflow_store, first.run_id, "loss")] == [1, 2, 3, 4, 5]
    assert len(mlflow_store.search_runs([run.info.experiment_id])) == 1

    with caplog.at_level(logging.WARNING):
        fresh = MLflowSink(experiment="CharLM", run_name="r", config=CONFIG, resume_run_id="0" * 32)
    assert fresh.run_id != first.run_id and "starting a new run" in caplog.text
    fresh.close()


def test_mlflow_sweep_jobs_share_the_experiment(mlflow_store):
    sinks = [MLflowSink(experiment="Sweep", run_name=f"job{i}", config=CONFIG, group="g1") for i in range(2)]
    for sink in sinks:
        sink.finish({}, "completed")
    runs = [mlflow_store.get_run(sink.run_id) for sink in sinks]
    assert runs[0].info.experiment_id == runs[1].info.experiment_id
    assert runs[0].info.run_id != runs[1].info.run_id
    assert all(run.data.tags["sweep"] == "g1" for run in runs)


def test_mlflow_explicit_tracking_uri(mlflow_store, tmp_path, monkeypatch):
    # Without the opt-out in the environment: the sink sets it for the file store it was
    # asked for (monkeypatch's undo of the earlier setenv removes it again).
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    store = tmp_path / "elsewhere"
    sink = MLflowSink(experiment="E", run_name="r", config=CONFIG, tracking_uri=store.as_uri())
    sink.write(train(1, 1.0))
    sink.close()
    from mlflow.tracking import MlflowClient

    assert history(MlflowClient(tracking_uri=store.as_uri()), sink.run_id, "loss") == [(1, 1.0)]
    assert mlflow_store.get_experiment_by_name("E") is None  # nothing in ./mlruns


def hide_module(monkeypatch, name: str) -> None:
    """import name (and its submodules, even ones imported before) raises ImportError."""
    for module in [key for key in sys.modules if key == name or key.startswith(name + ".")] or [name]:
        monkeypatch.setitem(sys.modules, module, None)


def test_mlflow_missing_package(monkeypatch):
    hide_module(monkeypatch, "mlflow")
    with pytest.raises(UserError) as raised:
        MLflowSink(experiment="E", run_name="r", config=CONFIG)
    assert "logging.mlflow.enabled" in str(raised.value)
    assert "pip install 'optimus-preflight[mlflow]'" in str(raised.value)


# ---------------------------------------------------------------- W&B


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))  # no credentials of this machine's user
    for name in ("DIR", "CACHE_DIR", "CONFIG_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(tmp_path / f"wandb-{name.lower()}"))


def wandb_run_files(run_dir: Path, run_id: str) -> list[Path]:
    """A resumed offline run writes a second directory (same id, -1 appended within a second)."""
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"))


def wandb_run_file(run_dir: Path, run_id: str) -> Path:
    (found,) = wandb_run_files(run_dir, run_id)
    return found


def wandb_records(path: Path):
    """The protobuf records of a .wandb file: W&B's header, then LevelDB log blocks."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pending, block = 7, b"", 32768
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        position += 7
        pending += data[position : position + length]
        position += length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_contents(path: Path) -> dict:
    """The run's records once its exit record is there: W&B's service process may write
    the last ones just after finish() returns on a loaded machine (waited for, 60 s bound)."""
    deadline = time.monotonic() + 60
    contents = _read_wandb(path)
    while contents["exit_code"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
        contents = _read_wandb(path)
    return contents


def _read_wandb(path: Path) -> dict:
    history, summary, run, exit_code = [], {}, None, None
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "run":
            run = record.run
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return {"history": history, "summary": summary, "run": run, "exit_code": exit_code}


def test_wandb_offline_history_summary_config(wandb_env, tmp_path):
    run_dir = tmp_path / "run"
    sink = WandbSink(project="CharLM", run_dir=run_dir, run_name="run-a", config=CONFIG, group="sweep-7")
    sink.write(train(1, 2.0))
    sink.write({"step": 1, "val_acc": 0.5})  # eval of the same step: the same row
    sink.write(train(2, 1.5))
    sink.write({"step": 2, "val_acc": 0.75})
    sink.finish({"final_loss": 1.5, "verdict": "ok", "eval": {"val_acc": 0.75}}, "completed")
    sink.close()

    contents = wandb_contents(wandb_run_file(run_dir, sink.resume_id()))
    rows = [{key: row[key] for key in ("_step", "loss", "val_acc", "time/data_ms") if key in row}
            for row in contents["history"]]
    assert rows == [{"_step": 1, "loss": 2.0, "val_acc": 0.5, "time/data_ms": 1.5},
                    {"_step": 2, "loss": 1.5, "val_acc": 0.75, "time/data_ms": 1.5}]
    assert all("phase" not in row for row in contents["history"])
    summary = contents["summary"]
    assert summary["final_loss"] == 1.5 and summary["verdict"] == "ok" and summary["status"] == "completed"
    assert summary["eval"] == {"val_acc": 0.75}
    run = contents["run"]
    assert run.project == "CharLM" and run.display_name == "run-a" and run.run_group == "sweep-7"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["optimizer"]["lr"] == 1e-3 and config["trainer"] == {"max_steps": 4}
    assert contents["exit_code"] == 0


@pytest.mark.parametrize(("status", "exit_code"), [("failed", 1), ("interrupted", 1), ("preflight_failed", 3)])
def test_wandb_exit_code(wandb_env, tmp_path, status, exit_code):
    sink = WandbSink(project="P", run_dir=tmp_path, run_name="r", config=CONFIG, mode="offline")
    sink.finish({}, status)
    sink.close()
    contents = wandb_contents(wandb_run_file(tmp_path, sink.resume_id()))
    assert contents["exit_code"] == exit_code and contents["summary"]["status"] == status


def test_wandb_steps_never_decrease_and_resume_keeps_the_id(wandb_env, tmp_path):
    sink = WandbSink(project="P", run_dir=tmp_path, run_name="r", config=CONFIG)
    sink.write(train(5, 1.0))
    sink.write(train(3, 9.0))  # W&B refuses a step below the last: dropped, not an error
    sink.finish({}, "interrupted")
    steps = [row["_step"] for row in wandb_contents(wandb_run_file(tmp_path, sink.resume_id()))["history"]]
    assert steps == [5]

    again = WandbSink(project="P", run_dir=tmp_path, run_name="r", config={**CONFIG, "seed": 1},
                      resume_id=sink.resume_id())
    assert again.resume_id() == sink.resume_id()
    again.write(train(6, 0.5))
    again.finish({}, "completed")
    files = wandb_run_files(tmp_path, sink.resume_id())
    assert len(files) == 2
    assert [[row["_step"] for row in wandb_contents(path)["history"]] for path in files] == [[5], [6]]


def test_wandb_online_without_login_is_a_user_error(wandb_env, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")  # mode None and no WANDB_MODE: online
    with pytest.raises(UserError) as raised:
        WandbSink(project="P", run_dir=tmp_path, run_name="r", config=CONFIG)
    assert "logging.wandb.mode" in str(raised.value) and "offline" in str(raised.value)


def test_wandb_missing_package(monkeypatch, tmp_path):
    hide_module(monkeypatch, "wandb")
    with pytest.raises(UserError) as raised:
        WandbSink(project="P", run_dir=tmp_path, run_name="r", config=CONFIG)
    assert "logging.wandb.enabled" in str(raised.value)
    assert "pip install 'optimus-preflight[wandb]'" in str(raised.value)


# ---------------------------------------------------------------- factory


def logging_config(**kinds: bool) -> LoggingConfig:
    cfg = LoggingConfig(csv=kinds.get("csv", False))
    cfg.mlflow.enabled = kinds.get("mlflow", False)
    cfg.wandb.enabled = kinds.get("wandb", False)
    return cfg


def test_factory_builds_and_resumes_the_enabled_sinks(mlflow_store, wandb_env, tmp_path):
    cfg = logging_config(csv=True, mlflow=True, wandb=True)
    cfg.mlflow.experiment_name = "Named"
    kwargs = {"config": CONFIG, "run_name": "r", "experiment": "CharLM", "group": "g", "after_step": None}
    sinks = make_logger_sinks(cfg, tmp_path / "run", resume_ids=None, **kwargs)
    assert [sink.kind for sink in sinks] == ["csv", "mlflow", "wandb"]
    for sink in sinks:
        sink.write(train(1, 1.0))
        sink.finish({"final_loss": 1.0}, "interrupted")
        sink.close()
    ids = {sink.kind: sink.resume_id() for sink in sinks if sink.resume_id()}
    assert set(ids) == {"mlflow", "wandb"}
    assert mlflow_store.get_experiment_by_name("Named") is not None
    assert (tmp_path / "run" / "metrics.csv").is_file()

    resumed = make_logger_sinks(cfg, tmp_path / "run", resume_ids=ids, **{**kwargs, "after_step": 0})
    assert {sink.kind: sink.resume_id() for sink in resumed if sink.resume_id()} == ids
    for sink in resumed:
        sink.close()
    assert strict_rows(tmp_path / "run" / "metrics.csv") == []  # after_step=0 dropped step 1
    assert make_logger_sinks(logging_config(), tmp_path, resume_ids=None, **kwargs) == []


def test_factory_ends_started_runs_when_a_later_sink_fails(mlflow_store, tmp_path, monkeypatch):
    hide_module(monkeypatch, "wandb")
    with pytest.raises(UserError, match="logging.wandb.enabled"):
        make_logger_sinks(logging_config(mlflow=True, wandb=True), tmp_path, config=CONFIG, run_name="r",
                          experiment="CharLM", group=None, after_step=None, resume_ids=None)
    (run,) = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("CharLM").experiment_id])
    assert run.info.status == "FAILED"


def test_the_sinks_leave_the_environment_as_it_was():
    assert os.environ.get("MLFLOW_ALLOW_FILE_STORE") == ALLOW_FILE_STORE_AT_IMPORT
