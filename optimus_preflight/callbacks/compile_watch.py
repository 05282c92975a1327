"""trainer.compile's warm-up and recompiles, watched from the loop's events."""

from __future__ import annotations

from typing import Any

from optimus_preflight.callbacks import Callback
from optimus_preflight.training.compiling import CompileWatch


class CompileWatchCallback(Callback):
    """The first step of the process compiles the graphs: it is logged with
    ``compile_warmup_s`` instead of ``samples_per_s``; later recompiles are counted (a
    storm of them is a warning) and both go into summary.json."""

    def __init__(self) -> None:
        self.watch: CompileWatch | None = None  # set once the model is compiled
        self._ended = False

    def start(self, compiled_modules: int) -> None:
        self.watch = CompileWatch(compiled_modules)

    def on_step_start(self, recipe: Any, step: int) -> None:
        if self.watch is not None:
            self._ended = False
            self.watch.start_step()

    def wants_step_logged(self, recipe: Any, step: int) -> bool:
        return self.watch is not None and self.watch.warmup_s is None

    def on_step_record(self, recipe: Any, step: int, result: Any, record: dict[str, Any]) -> None:
        if self.watch is None:
            return
        warming_up = self.watch.warmup_s is None
        self._end(step)
        if warming_up:  # the compile, not the model's speed
            record.pop("samples_per_s", None)
            record["compile_warmup_s"] = self.watch.warmup_s

    def on_step_end(self, recipe: Any, step: int, record: dict[str, Any] | None) -> None:
        if self.watch is not None and not self._ended:
            self._end(step)

    def _end(self, step: int) -> None:
        self._ended = True
        self.watch.end_step(step)

    def summary(self) -> dict[str, Any]:
        return self.watch.summary() if self.watch is not None else {}
