"""A tqdm bar on a terminal; plain periodic log lines everywhere else (CI, SLURM).

While the bar is open, console log records are written through it
(as tqdm.contrib.logging.logging_redirect_tqdm does), so a checkpoint line does not
leave a frozen copy of the bar behind; the periodic step lines the bar replaces on the
terminal still go to train.log. A console that goes away (a closed terminal, a pipe
whose reader exited) ends the bar and the console lines quietly; the run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any

from tqdm.auto import tqdm
from tqdm.contrib.logging import _TqdmLoggingHandler

from optimus_preflight.reporting.run_log import QuietConsoleMixin, console_gone, is_console, log_to_files

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


class _BarLogHandler(QuietConsoleMixin, _TqdmLoggingHandler):
    """Log records written above the bar, quiet once the console is gone."""

    owns_its_errors = False  # tqdm.write also redraws the bar, on its own stream


@contextlib.contextmanager
def _logs_through_bar(loggers: tuple[logging.Logger, ...] = (logging.root,)) -> Any:
    """tqdm's logging_redirect_tqdm, with a handler that survives a dead console."""
    saved = [logger.handlers for logger in loggers]
    try:
        for logger in loggers:
            console = next((handler for handler in logger.handlers if is_console(handler)), None)
            through_bar = _BarLogHandler(tqdm)
            if console is not None:
                through_bar.setFormatter(console.formatter)
                through_bar.stream = console.stream
                through_bar.console_is_gone = getattr(console, "console_is_gone", False)
                for log_filter in console.filters:
                    through_bar.addFilter(log_filter)
            logger.handlers = [handler for handler in logger.handlers if not is_console(handler)] + [through_bar]
        yield
    finally:
        for logger, handlers in zip(loggers, saved):
            logger.handlers = handlers


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
            try:
                self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True)
            except (OSError, ValueError) as error:
                if not console_gone(error):
                    raise
                return  # no console to draw on: the step lines still reach train.log
            self._redirect.enter_context(_logs_through_bar())

    def _on_bar(self, action: str, *args: Any, **kwargs: Any) -> None:
        """Call a method of the bar; a console that is gone ends the bar, not the run
        (tqdm itself only survives EIO, and only on its own writes)."""
        if self._bar is None:
            return
        try:
            getattr(self._bar, action)(*args, **kwargs)
        except (OSError, ValueError) as error:
            if not console_gone(error):
                raise
            self._bar.disable = True  # its close() must not write again
            self._bar = None

    def advance(self, steps: int = 1) -> None:
        self._on_bar("update", steps)

    def report(self, record: dict[str, Any]) -> None:
        if self.mode == "none":
            return
        fields = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}"}
        if "grad_norm" in record:
            fields["gnorm"] = f"{record['grad_norm']:.3f}"
        for name in sorted(self._shown):
            if isinstance(record.get(name), float):
                fields[name] = f"{record[name]:.4g}"
        self._on_bar("set_postfix", fields, refresh=False)
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
        self._on_bar("close")
        self._bar = None
        self._redirect.close()
