"""The experiment trackers of a run (logging.csv, logging.mlflow, logging.wandb): opened
once, fed through the step logger, and finished with the run's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from optimus_preflight.reporting.loggers import make_logger_sinks


class Trackers:
    def __init__(self) -> None:
        self.sinks: list[Any] = []

    def open(self, cfg: DictConfig, run_dir: Path, *, experiment: str, after_step: int, ids: dict[str, str]) -> None:
        """Start them (once); ``ids``: the run state's tracker run ids, continued on resume
        and updated with the new ones."""
        if self.sinks:
            return
        from hydra.core.hydra_config import HydraConfig

        group = None
        if HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN":
            group = str(HydraConfig.get().sweep.dir)  # a sweep's jobs are one group/experiment
        self.sinks = make_logger_sinks(cfg.logging, run_dir, config=OmegaConf.to_container(cfg, resolve=True),
                                       run_name=f"{run_dir.parent.name}/{run_dir.name}", experiment=experiment,
                                       group=group, after_step=after_step, resume_ids=ids)
        for sink in self.sinks:
            if (run_id := sink.resume_id()) is not None:
                ids[sink.kind] = run_id

    def for_step_logger(self) -> list[Any]:
        return [_ClosedAtFinish(sink) for sink in self.sinks]

    def finish(self, summary: dict[str, Any], status: str) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.finish(summary, status)
            finally:
                sink.close()


class _ClosedAtFinish:
    """A tracker inside the step logger: the logger's close only flushes it; the summary
    is sent (and the tracker's run ended) by ``Trackers.finish``."""

    def __init__(self, sink: Any):
        self.sink = sink

    def write(self, record: dict[str, Any]) -> None:
        self.sink.write(record)

    def flush(self) -> None:
        if hasattr(self.sink, "flush"):
            self.sink.flush()

    def close(self) -> None:
        self.flush()
