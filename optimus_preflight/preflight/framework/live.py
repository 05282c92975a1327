"""The check that is running now, so a long preflight is never silent: an overfit smoke of
200 steps takes minutes, and a DataLoader that hangs is waited on for
``preflight.first_batch_timeout_s`` (5 minutes by default) before it is named.

- On a terminal: one status line under the log ("preflight: running step.overfit (12 s)"),
  redrawn twice a second by a daemon thread and erased when the check ends. It is a tqdm
  bar with only a description, so log records written meanwhile go above it
  (``reporting.progress``'s redirect) instead of through it.
- Elsewhere (CI, SLURM, a file): nothing for a check that ends within ``every_s``, then a
  plain "still running" log line every ``every_s``; a log file never has a status line's
  carriage returns in it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from optimus_preflight.reporting.progress import _logs_through_bar
from optimus_preflight.reporting.run_log import console_gone

log = logging.getLogger("optimus_preflight")

STILL_RUNNING_EVERY_S = 60.0
REDRAW_EVERY_S = 0.5


class LiveCheckLine:
    """``with live.running(check_name): ...`` around each check."""

    def __init__(self, *, terminal: TextIO | None = None, every_s: float = STILL_RUNNING_EVERY_S,
                 redraw_s: float = REDRAW_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] | None = None):
        self.terminal = terminal  # a TTY stream: draw a status line on it; None: log lines
        self.every_s = every_s
        self.redraw_s = redraw_s
        self.clock = clock
        self.say = say or (lambda line: log.info("%s", line))

    @classmethod
    def for_console(cls) -> LiveCheckLine:
        stream = sys.stderr
        try:
            terminal = stream if stream.isatty() else None
        except (OSError, ValueError):
            terminal = None
        return cls(terminal=terminal, every_s=STILL_RUNNING_EVERY_S, redraw_s=REDRAW_EVERY_S)

    @contextlib.contextmanager
    def running(self, name: str) -> Iterator[None]:
        done = threading.Event()
        started = self.clock()
        with contextlib.ExitStack() as stack:
            bar = self._open_bar(name, stack) if self.terminal is not None else None
            thread = threading.Thread(target=self._watch, args=(name, started, done, bar), daemon=True,
                                      name="preflight-live-line")
            thread.start()
            try:
                yield
            finally:
                done.set()
                thread.join()

    def _open_bar(self, name: str, stack: contextlib.ExitStack) -> Any:
        from tqdm.auto import tqdm

        try:
            bar = tqdm(total=None, desc=self._text(name, 0.0), bar_format="{desc}", file=self.terminal,
                       leave=False, dynamic_ncols=True)
        except (OSError, ValueError) as error:
            if not console_gone(error):
                raise
            return None
        stack.callback(self._on_bar, bar, "close")
        stack.enter_context(_logs_through_bar())
        return bar

    @staticmethod
    def _text(name: str, elapsed: float) -> str:
        return f"preflight: running {name} ({elapsed:.0f} s)"

    @staticmethod
    def _on_bar(bar: Any, action: str, *args: Any) -> bool:
        """A console that went away ends the status line, never the preflight."""
        try:
            getattr(bar, action)(*args)
        except (OSError, ValueError) as error:
            if not console_gone(error):
                raise
            bar.disable = True
            return False
        return True

    def _watch(self, name: str, started: float, done: threading.Event, bar: Any) -> None:
        next_line = self.every_s
        while not done.wait(self.redraw_s):
            elapsed = self.clock() - started
            if bar is not None:
                if not self._on_bar(bar, "set_description_str", self._text(name, elapsed)):
                    bar = None
            elif self.terminal is None and elapsed >= next_line:
                self.say(f"preflight: still running {name} ({elapsed:.0f} s)")
                next_line = (elapsed // self.every_s + 1) * self.every_s
