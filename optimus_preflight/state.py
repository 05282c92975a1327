"""Counters of a run that a checkpoint must carry to resume exactly."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from optimus_preflight.errors import TrainingDiverged


@dataclass
class RunState:
    step: int = 0
    skipped_steps: int = 0
    consecutive_skips: int = 0
    samples_seen: int = 0

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

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))
