"""A tqdm bar on a terminal; plain periodic log lines everywhere else (CI, SLURM).

While the bar is open, console log records are written through it
(tqdm.contrib.logging.logging_redirect_tqdm), so a checkpoint line does not leave a
frozen copy of the bar behind; the periodic step lines the bar replaces on the
terminal still go to train.log.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from optimus_preflight.reporting.run_log import log_to_files

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
        self._shown: set[str] = set()  # a recipe's own metrics logged with prog_bar=True
        self._redirect = contextlib.ExitStack()
        if mode != "none" and use_bar(mode):
            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True)
            self._redirect.enter_context(logging_redirect_tqdm(tqdm_class=tqdm))

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def report(self, record: dict[str, Any]) -> None:
        if self.mode == "none":
            return
        fields = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}"}
        if "grad_norm" in record:
            fields["gnorm"] = f"{record['grad_norm']:.3f}"
        for name in sorted(self._shown):
            if isinstance(record.get(name), float):
                fields[name] = f"{record[name]:.4g}"
        if self._bar is not None:
            self._bar.set_postfix(fields, refresh=False)
        step = record["step"]
        done = step - self.start_step
        elapsed = time.monotonic() - self.started
        eta = elapsed / done * (self.total - step) if done > 0 else 0.0
        text = " | ".join(f"{k} {v}" for k, v in fields.items())
        rate = record.get("samples_per_s")
        rate_text = f" | {rate:.0f} samples/s" if rate else ""
        epoch = f"epoch {record['epoch']} | " if "epoch" in record else ""
        line = f"step {step}/{self.total} | {epoch}{text}{rate_text} | eta {format_eta(eta)}"
        if self._bar is not None:
            log_to_files(log, logging.INFO, line)  # the bar shows these figures on the terminal
        else:
            log.info(line)

    def show(self, names: set[str]) -> None:
        """Also show these metrics (``self.log(..., prog_bar=True)``)."""
        self._shown |= names

    def write(self, message: str) -> None:
        log.info(message)  # through the bar while it is open

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._redirect.close()
