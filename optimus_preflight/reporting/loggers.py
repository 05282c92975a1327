"""More metric sinks: metrics.csv, MLflow and Weights & Biases.

Besides MetricSink's write/close (and flush) each has ``finish(summary, status)``, called
once before close with status completed|interrupted|failed|preflight_failed, and
``resume_id()``: what a checkpoint keeps so that a resumed run continues the same
tracker run (None for CSV). Build them with ``make_logger_sinks``.

Why this module is long (~400 lines): three trackers, each with its own resume and
failure handling; one file keeps their shared contract (write, finish, resume_id, close)
in view.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import numbers
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from optimus_preflight.errors import EXIT_PREFLIGHT_FAILED, StorageError, UserError
from optimus_preflight.reporting.summary import write_text_atomic

log = logging.getLogger(__name__)


def numeric_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """What a tracker can plot; bools are ints to Python but not metrics."""
    return {key: float(value) for key, value in record.items()
            if key != "step" and isinstance(value, numbers.Real) and not isinstance(value, bool)}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys, the way Hydra overrides name them (optimizer.lr)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _step(record: Mapping[str, Any]) -> int:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    return (items[start : start + size] for start in range(0, len(items), size))


class CsvSink:
    """metrics.csv: a row per record, a column per key seen so far.

    A key seen for the first time (the first eval, a user metric from step 100) rewrites
    the file atomically with the wider header; otherwise rows are appended. Rows are
    buffered and written whole on flush: a reader never finds half a row.
    """

    kind = "csv"

    def __init__(self, path: Path, *, after_step: int | None = None, flush_every_s: float = 5.0):
        self.path, self.flush_every_s = path, flush_every_s
        self._pending: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._file: Any = None
        self._columns, rows, changed = self._load(after_step)
        if changed:
            self._rewrite(rows)
        elif self._columns:
            self._file = self._guard(lambda: open(path, "a", encoding="utf-8", newline=""))

    def _guard(self, action: Any) -> Any:
        try:
            return action()
        except OSError as error:
            raise StorageError.from_os_error(error, self.path.name, self.path.parent) from None

    def _load(self, after_step: int | None = None) -> tuple[list[str], list[dict[str, str]], bool]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return [], [], False
        except OSError as error:
            raise StorageError.from_os_error(error, self.path.name, self.path.parent) from None
        changed = bool(text) and not text.endswith("\n")
        if changed:  # a last row cut short by a kill: the next row would be glued onto it
            text = text[: text.rfind("\n") + 1]
        reader = csv.reader(io.StringIO(text))
        header = next(reader, [])
        rows = [dict(zip(header, row)) for row in reader]
        if after_step is not None:  # a resumed run logs the steps after its checkpoint again
            kept = [row for row in rows if _int(row.get("step")) <= after_step]
            if len(kept) != len(rows):
                log.info("%s: dropped %d row(s) after step %d, which this run logs again",
                         self.path.name, len(rows) - len(kept), after_step)
                rows, changed = kept, True
        return header, rows, changed

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        buffer = io.StringIO()
        if self._columns:
            writer = csv.DictWriter(buffer, self._columns, restval="", lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
        if self._file is not None:
            self._guard(self._file.close)  # it points at the file os.replace swaps out
        self._guard(lambda: write_text_atomic(self.path, buffer.getvalue()))
        self._file = self._guard(lambda: open(self.path, "a", encoding="utf-8", newline=""))

    def write(self, record: dict[str, Any]) -> None:
        row = {key: _cell(value) for key, value in record.items()}
        if new := [key for key in row if key not in self._columns]:
            if not self._columns and "step" in new:
                new.insert(0, new.pop(new.index("step")))
            self._columns = self._columns + new
            self._rewrite(self._load()[1] + self._pending + [row])
            self._pending = []
            return
        self._pending.append(row)
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if self._pending and self._file is not None:
            buffer = io.StringIO()
            csv.DictWriter(buffer, self._columns, restval="", lineterminator="\n").writerows(self._pending)
            self._pending = []
            self._guard(lambda: (self._file.write(buffer.getvalue()), self._file.flush()))

    def sync(self) -> None:
        """Flush and fsync (as a checkpoint is written)."""
        self.flush()
        if self._file is not None and not self._file.closed:
            self._guard(lambda: os.fsync(self._file.fileno()))

    def finish(self, summary: dict[str, Any], status: str) -> None:
        """Nothing to add: the summary has its own file."""

    def resume_id(self) -> str | None:
        return None

    def close(self) -> None:
        """Never raises: it runs while a run is already stopping, maybe for this very disk."""
        try:
            try:
                self.flush()
            finally:
                if self._file is not None:
                    self._file.close()
        except Exception as error:
            log.error("the last rows of %s could not be written: %s", self.path, error)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return value if isinstance(value, (str, numbers.Real)) else _text(value)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1  # a row without a step is kept


class _Tracker:
    """What the MLflow and W&B sinks share: a tracker failing mid-run (a server down)
    must not stop training, and a run must not be left open."""

    name = ""
    _done, _failures = False, 0

    def _failed(self, step: int, error: Exception) -> None:
        self._failures += 1
        if self._failures in (1, 10, 100, 1000):
            log.warning("%s: %d logging call(s) failed so far, the last at step %d: %s",
                        self.name, self._failures, step, error)

    def finish(self, summary: dict[str, Any], status: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Never raises. Without a finish first the outcome is unknown: the run ends failed."""
        self.finish({}, "failed")


def _missing(tracker: str, package: str) -> UserError:
    return UserError(f"{tracker} logging is on but the {package} package is not installed",
                     key=f"logging.{package}.enabled",
                     fix=f"Install it with pip install 'optimus-preflight[{package}]', "
                         f"or set logging.{package}.enabled=false")


_MLFLOW_STATUS = {"completed": "FINISHED", "interrupted": "KILLED", "failed": "FAILED", "preflight_failed": "FAILED"}
# Older MLflow servers refuse param values over 500 chars (newer: 6000) and tag values
# over 5000 (newer: 8000); the whole config is also logged as the artifact config.json.
_PARAM_CHARS, _TAG_CHARS, _KEY_CHARS = 500, 5000, 250


def _mlflow_key(key: str) -> str:
    # MLflow names are file paths in its file store: no other characters, no empty parts.
    parts = re.sub(r"[^/\w.\- ]", "_", str(key)).split("/")
    return "/".join(part for part in parts if part not in ("", ".", ".."))[:_KEY_CHARS]


class MLflowSink(_Tracker):
    """Params: the config flattened to dotted keys; metrics per step. At finish: the
    summary's numbers as metrics ``final/<key>``, its strings and bools as tags
    ``final/<key>`` (lists left out), tag ``optimus.status``; then the run ends FINISHED,
    KILLED (interrupted) or FAILED. ``tracking_uri`` None: $MLFLOW_TRACKING_URI, else
    the file store ./mlruns."""

    kind, name = "mlflow", "MLflow"

    def __init__(self, *, experiment: str, run_name: str, config: Mapping[str, Any], tracking_uri: str | None = None,
                 group: str | None = None, resume_run_id: str | None = None):
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing("MLflow", "mlflow") from None
        self._Metric, self._RunTag, self._last_step = Metric, RunTag, 0
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or (Path.cwd() / "mlruns").as_uri()
        if uri.startswith("file:") or (":" not in uri and uri != "databricks"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 refuses it otherwise
        try:
            self._client = client = MlflowClient(tracking_uri=uri)
            experiment_id, existing, self._run_id = self._experiment_id(experiment, MlflowException), {}, ""
            if resume_run_id:
                try:
                    existing = dict(client.get_run(resume_run_id).data.params)
                    client.update_run(resume_run_id, status="RUNNING")
                    self._run_id = resume_run_id
                except MlflowException as error:
                    log.warning("MLflow run %s not found at %s (%s): starting a new run", resume_run_id, uri, error.message)
            self._run_id = self._run_id or client.create_run(experiment_id, run_name=run_name).info.run_id
            params = {_mlflow_key(key): _text(value)[:_PARAM_CHARS] for key, value in flatten(config).items()}
            params.pop("", None)
            # Params are immutable in MLflow: a resumed run keeps the values it started with.
            if changed := sorted(key for key, value in params.items() if existing.get(key, value) != value):
                log.warning("MLflow keeps the first values of the params %s of resumed run %s", changed[:10], self._run_id)
            for chunk in _chunks([Param(key, value) for key, value in params.items() if key not in existing], 100):
                client.log_batch(self._run_id, params=chunk)
            if group:
                client.set_tag(self._run_id, "sweep", group[:_TAG_CHARS])
        except MlflowException as error:
            raise UserError(f"MLflow at {uri} refused the run: {error.message}", key="logging.mlflow.tracking_uri",
                            fix="Check that server or directory, or set logging.mlflow.enabled=false") from None
        try:
            client.log_dict(self._run_id, json.loads(json.dumps(dict(config), default=str)), "config.json")
        except Exception as error:  # an artifact store that wants credentials must not stop training
            log.warning("MLflow: config.json not logged as an artifact: %s", error)

    def _experiment_id(self, name: str, mlflow_exception: type[Exception]) -> str:
        experiment = self._client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return self._client.create_experiment(name)
            except mlflow_exception:  # another job of the sweep created it first
                if (experiment := self._client.get_experiment_by_name(name)) is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            raise UserError(f"the MLflow experiment {name!r} is deleted", key="logging.mlflow.experiment_name",
                            fix="Restore it (mlflow experiments restore) or choose another name")
        return experiment.experiment_id

    @property
    def run_id(self) -> str:
        return self._run_id

    def resume_id(self) -> str | None:
        return self._run_id

    def _log(self, metrics: dict[str, float], step: int, tags: Sequence[Any] = ()) -> None:
        stamp = int(time.time() * 1000)
        entities = [self._Metric(_mlflow_key(key), value, stamp, step) for key, value in metrics.items()]
        try:
            for chunk in _chunks(entities, 1000):
                self._client.log_batch(self._run_id, metrics=chunk)
            for chunk in _chunks(list(tags), 100):
                self._client.log_batch(self._run_id, tags=chunk)
        except Exception as error:
            self._failed(step, error)

    def write(self, record: dict[str, Any]) -> None:
        if not self._done and (metrics := numeric_metrics(record)):
            self._last_step = _step(record)
            self._log(metrics, self._last_step)

    def finish(self, summary: dict[str, Any], status: str) -> None:
        if self._done:
            return
        self._done, flat = True, flatten(summary)
        tags = [self._RunTag(_mlflow_key(f"final/{key}"), str(value)[:_TAG_CHARS])
                for key, value in flat.items() if isinstance(value, (str, bool))]
        self._log({f"final/{key}": value for key, value in numeric_metrics(flat).items()}, self._last_step,
                  [*tags, self._RunTag("optimus.status", status)])
        try:
            self._client.set_terminated(self._run_id, status=_MLFLOW_STATUS.get(status, "FAILED"))
        except Exception as error:
            log.warning("MLflow: run %s not marked as ended: %s", self._run_id, error)


class WandbSink(_Tracker):
    """``run.log(metrics, step=step)`` per record; at finish the summary, with ``status``,
    into ``run.summary``, and ``run.finish`` with a nonzero exit code unless the run
    completed. Files land in ``<run_dir>/wandb/``. ``mode`` None: $WANDB_MODE, else online."""

    kind, name = "wandb", "W&B"

    def __init__(self, *, project: str, run_dir: Path, run_name: str, config: Mapping[str, Any],
                 entity: str | None = None, mode: str | None = None, group: str | None = None,
                 resume_id: str | None = None):
        try:
            import wandb
        except ImportError:
            raise _missing("W&B", "wandb") from None
        mode = mode or os.environ.get("WANDB_MODE") or "online"
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(project=project, entity=entity, name=run_name, group=group, config=dict(config),
                                   dir=str(run_dir), mode=mode, id=resume_id, resume="allow" if resume_id else None,
                                   allow_val_change=True)  # a resumed run may change its config (more steps)
        except (wandb.errors.Error, OSError) as error:
            raise UserError(f"W&B could not start the run (mode {mode}): {error}", key="logging.wandb.mode",
                            fix="Log in (wandb login, or set WANDB_API_KEY), or log without network with "
                                "logging.wandb.mode=offline and upload later with wandb sync") from None
        # W&B drops steps below the ones it has: after an online resume it keeps the values
        # it got before the restart for the steps this run logs again.
        self._next_step = int(getattr(self._run, "step", 0) or 0)

    def resume_id(self) -> str | None:
        return self._run.id

    def write(self, record: dict[str, Any]) -> None:
        step = _step(record)
        if self._done or step < self._next_step or not (metrics := numeric_metrics(record)):
            return
        self._next_step = step  # the eval record of a step comes after its training record: one row
        try:
            self._run.log(metrics, step=step)
        except Exception as error:
            self._failed(step, error)

    def finish(self, summary: dict[str, Any], status: str) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._run.summary.update({**json.loads(json.dumps(summary, default=str)), "status": status})
        except Exception as error:
            log.warning("W&B: the final summary was not recorded: %s", error)
        try:
            self._run.finish(exit_code={"completed": 0, "preflight_failed": EXIT_PREFLIGHT_FAILED}.get(status, 1))
        except Exception as error:
            log.warning("W&B: run %s not finished cleanly: %s", self._run.id, error)


LoggerSink = CsvSink | MLflowSink | WandbSink


def make_logger_sinks(logging_cfg: Any, run_dir: Path, *, config: Mapping[str, Any], run_name: str, experiment: str,
                      group: str | None, after_step: int | None, resume_ids: dict[str, str] | None) -> list[LoggerSink]:
    """The sinks ``logging_cfg`` (LoggingConfig) enables. ``experiment``: the MLflow
    experiment and W&B project unless configured (the recipe class name); ``group``: a
    sweep's, shared by its jobs; ``resume_ids``: sink kind ("mlflow", "wandb") to the id
    a checkpoint kept."""
    if not isinstance(config, dict):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)  # type: ignore[assignment]
    resume_ids, sinks = resume_ids or {}, []
    try:
        if logging_cfg.csv:
            sinks.append(CsvSink(run_dir / "metrics.csv", after_step=after_step,
                                 flush_every_s=getattr(logging_cfg, "flush_every_s", 5.0)))
        if (mlflow_cfg := logging_cfg.mlflow).enabled:
            sinks.append(MLflowSink(experiment=mlflow_cfg.experiment_name or experiment, run_name=run_name,
                                    config=config, tracking_uri=mlflow_cfg.tracking_uri, group=group,
                                    resume_run_id=resume_ids.get("mlflow")))
        if (wandb_cfg := logging_cfg.wandb).enabled:
            sinks.append(WandbSink(project=wandb_cfg.project or experiment, run_dir=run_dir, run_name=run_name,
                                   config=config, entity=wandb_cfg.entity, mode=wandb_cfg.mode, group=group,
                                   resume_id=resume_ids.get("wandb")))
    except BaseException:
        for sink in sinks:  # this run does not start: the trackers' runs must not stay open
            sink.close()
        raise
    return sinks
