"""A tqdm bar on a terminal; plain periodic log lines everywhere else (CI, SLURM)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from tqdm.auto import tqdm

log = logging.getLogger("optimus_preflight")


def use_bar(mode: str) -> bool:
    if mode == "auto":
        return sys.stderr.isatty()
    return mode == "bar"


def format_eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class Progress:
    def __init__(self, mode: str, total_steps: int, initial_step: int = 0):
        self.mode = mode
        self.total = total_steps
        self.start_step = initial_step
        self.started = time.monotonic()
        self._bar = None
        if mode != "none" and use_bar(mode):
            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def report(self, record: dict[str, Any]) -> None:
        if self.mode == "none":
            return
        fields = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}"}
        if "grad_norm" in record:
            fields["gnorm"] = f"{record['grad_norm']:.3f}"
        if self._bar is not None:
            self._bar.set_postfix(fields, refresh=False)
            return
        step = record["step"]
        done = step - self.start_step
        elapsed = time.monotonic() - self.started
        eta = elapsed / done * (self.total - step) if done > 0 else 0.0
        text = " | ".join(f"{k} {v}" for k, v in fields.items())
        rate = record.get("samples_per_s")
        rate_text = f" | {rate:.0f} samples/s" if rate else ""
        log.info("step %d/%d | %s%s | eta %s", step, self.total, text, rate_text, format_eta(eta))

    def write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message)
        else:
            log.info(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
