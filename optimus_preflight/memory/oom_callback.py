"""preflight.oom_observer on the loop's events: recording from the first step of
training, stopped when the run ends."""

from __future__ import annotations

from typing import Any

from optimus_preflight.callbacks import Callback
from optimus_preflight.memory.oom import start_oom_observer
from optimus_preflight.training.distributed import unwrap


class OOMRecorderCallback(Callback):
    """On CUDA: an allocator history and, on an out-of-memory error, a snapshot with a
    hint that uses the preflight's largest micro-batch that fits (memory/oom.py)."""

    def __init__(self) -> None:
        self.observer: Any = None

    def on_fit_start(self, recipe: Any) -> None:
        check = recipe.preflight_report.check("memory.vram_headroom") if recipe.preflight_report else None
        context = recipe.training_context
        self.observer = start_oom_observer(
            recipe.cfg, recipe.run_dir, rank=context.dist.rank, model=unwrap(recipe.model), optimizer=recipe.optimizer,
            precision=context.precision, largest_batch=check.data.get("largest_micro_batch") if check else None)

    def on_fit_end(self, recipe: Any, summary: dict[str, Any]) -> None:
        self.close()

    def on_exception(self, recipe: Any, error: BaseException) -> None:
        self.close()

    def close(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer = None
