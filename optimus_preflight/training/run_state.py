"""What a run has done so far, which a checkpoint carries so a resume continues it:
its counters, the losses it reports, and an evaluation a stop cut short."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from optimus_preflight.errors import TrainingDiverged


@dataclass
class RunState:
    step: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    samples_seen: int = 0
    # The last logged training loss and validation loss (summary.json's final_*).
    final_loss: float | None = None
    final_val_loss: float | None = None
    # An evaluation a stop signal cut short: a resumed run redoes it first.
    eval_pending: bool = False
    # The last evaluation's metrics (val_loss, val_<name>) and the test metrics.
    final_metrics: dict[str, float] = field(default_factory=dict)
    # Why training ended before its limit (early stopping), for summary.json.
    stop_reason: str | None = None
    # The experiment trackers' run ids (MLflow, W&B): a resumed run continues their runs.
    logger_ids: dict[str, str] = field(default_factory=dict)
    # The callbacks' own state (optimus_preflight.callbacks), read from them at each save.
    callbacks: dict[str, Any] = field(default_factory=dict)

    # Called by state_dict() for the callbacks' current state (no annotation: not a field).
    callback_state = None
    def record_step(self, stepped: bool, samples: int) -> None:
        self.step += 1
        self.samples_seen += samples
        if stepped:
            self.consecutive_skips = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skips += 1

    def check_divergence(self, limit: int, precision: str, last_loss: float) -> None:
        if self.consecutive_skips < limit:
            return
        cause = (
            "fp16 overflow the GradScaler cannot absorb (trainer.precision=bf16 has fp32's range)"
            if precision == "fp16"
            else "a learning rate too high for this model (lower optimizer.lr or lengthen "
            "scheduler.warmup_steps), or inf/NaN in the data"
        )
        raise TrainingDiverged(
            f"the last {self.consecutive_skips} optimizer steps (up to step {self.step}) all had "
            f"non-finite gradients and were skipped; last loss {last_loss}. Likely cause: {cause}",
            key="trainer.max_consecutive_skips",
            fix="Fix the cause above; raise trainer.max_consecutive_skips only if occasional "
            "overflow is expected.",
        )

    def state_dict(self) -> dict[str, Any]:
        if self.callback_state is not None:
            self.callbacks = self.callback_state()
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Missing keys keep their defaults (older checkpoints held only the counters)."""
        for item in fields(self):
            if item.name not in state:
                continue
            value = state[item.name]
            if item.name in ("final_metrics", "logger_ids", "callbacks"):
                value = dict(value or {})
            elif item.name == "stop_reason":
                value = None if value is None else str(value)
            elif item.name.startswith("final_"):
                value = None if value is None else float(value)
            elif item.name == "eval_pending":
                value = bool(value)
            else:
                value = int(value)
            setattr(self, item.name, value)
