"""A char-LM recipe that SIGKILLs one of its own DataLoader workers at a chosen
training step (KILL_WORKER_AT_STEP), as the kernel's OOM killer would."""

from __future__ import annotations

import os
import signal

import psutil

from optimus_preflight.recipes.char_lm import CharLMRecipe


class WorkerKillingRecipe(CharLMRecipe):
    def compute_loss(self, model, batch):
        at = int(os.environ.get("KILL_WORKER_AT_STEP", "0"))
        if at and model.training and self.preflight_report is not None and self.state.step == at:
            os.environ["KILL_WORKER_AT_STEP"] = "0"
            workers = [child for child in psutil.Process().children() if child.is_running()]
            os.kill(workers[0].pid, signal.SIGKILL)
        return super().compute_loss(model, batch)
