"""Callbacks that SIGKILL their own process (the OOM killer's signal: nothing runs after
it) at a chosen moment, once: a marker file in the run dir says it happened."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from optimus_preflight.callbacks import Callback


class KillOnce(Callback):
    def __init__(self, step: int, when: str = "step_end"):
        self.step, self.when = step, when

    def _kill(self, recipe: Any) -> None:
        marker = Path(recipe.run_dir) / "killed.marker"
        if not marker.exists():
            marker.write_text(self.when)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_step_end(self, recipe: Any, step: int, record: Any) -> None:
        if self.when == "step_end" and step == self.step:
            self._kill(recipe)

    def on_checkpoint(self, recipe: Any, path: Any) -> None:
        if self.when == "checkpoint" and recipe.state.step == self.step:
            self._kill(recipe)

    def on_eval_end(self, recipe: Any, step: int, metrics: Any) -> None:
        if self.when == "eval" and step == self.step:
            self._kill(recipe)
