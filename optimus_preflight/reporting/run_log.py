"""train.log, written only once the run is known to be valid.

Hydra opens its job log file as the job starts, so a run started with a bad value
would append to (or create) the train.log of the run directory it was pointed at.
The file handler in conf/hydra/job_logging/optimus.yaml holds the records instead,
and writes them, in order, when the run commits to its directory (``RunDirectory``);
a run that never commits drops them (they were shown on the console).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections import deque
from typing import TextIO

from optimus_preflight.config.invocation import speaker

# A console that is gone: a pipe whose reader exited (`| head`), a terminal closed (EIO).
_GONE_ERRNOS = (errno.EPIPE, errno.EIO)


def console_gone(error: BaseException | None) -> bool:
    """Whether a write error means the reader of the stream is gone for good."""
    if isinstance(error, OSError):
        return error.errno in _GONE_ERRNOS
    return isinstance(error, ValueError) and "closed file" in str(error)


def silence_stream(stream: TextIO) -> None:
    """Point a dead console stream's descriptor at /dev/null: what is still buffered, and
    the interpreter's flush at exit, then go nowhere instead of raising again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # not a real descriptor (a test's StringIO): the handler's own flag suffices


class QuietConsoleMixin:
    """For a console log handler: once its reader is gone (``console_gone``), stop writing
    to it without a word (there is nobody to read one) instead of a traceback per record;
    the run goes on, and train.log and metrics.jsonl keep everything."""

    console_is_gone = False
    # Whether the failed write can only have been to this handler's own stream (not to a
    # progress bar's, which a handler writing through the bar also touches).
    owns_its_errors = True

    def handleError(self, record: logging.LogRecord) -> None:
        if not console_gone(sys.exc_info()[1]):
            super().handleError(record)  # type: ignore[misc]
            return
        self.console_is_gone = True
        if self.owns_its_errors:
            silence_stream(self.stream)  # type: ignore[attr-defined]

    def emit(self, record: logging.LogRecord) -> None:
        if not self.console_is_gone:
            super().emit(record)  # type: ignore[misc]


class ConsoleHandler(QuietConsoleMixin, logging.StreamHandler):
    """The console handler of conf/hydra/job_logging/optimus.yaml."""


class _QuietFileHandler(logging.FileHandler):
    """A failed write (a full disk) is reported once, in one line: logging's default is
    a traceback per record, which buries the one message that says what happened."""

    _reported = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self._reported:
            self._reported = True
            error = sys.exc_info()[1]
            sys.stderr.write(f"{speaker()}: {self.baseFilename} stopped taking log lines ({error}); "
                             "the console still has them\n")


class DeferredFileHandler(logging.Handler):
    """A FileHandler that opens its file on ``open()``; records before that are held."""

    def __init__(self, filename: str, mode: str = "a", encoding: str | None = "utf-8", max_held: int = 10_000):
        super().__init__()
        self.filename = filename
        self.mode = mode
        self.encoding = encoding
        self._held: deque[logging.LogRecord] = deque(maxlen=max_held)
        self._file: logging.FileHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is None:
            self._held.append(record)
        else:
            self._file.emit(record)

    def open(self) -> None:
        if self._file is not None:
            return
        self._file = _QuietFileHandler(self.filename, self.mode, self.encoding)
        self._file.setFormatter(self.formatter)
        while self._held:
            self._file.emit(self._held.popleft())

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._held.clear()
        super().close()


def open_deferred_logs() -> None:
    for handler in logging.getLogger().handlers:
        if isinstance(handler, DeferredFileHandler):
            handler.open()


def is_console(handler: logging.Handler) -> bool:
    # The same test as tqdm.contrib.logging's, so its bar-safe handler counts as console.
    return isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (sys.stdout, sys.stderr)


def log_to_files(logger: logging.Logger, level: int, message: str, *, exc_info: bool = False) -> None:
    """A record for the log files (train.log) only: what the console already shows in
    another form (a traceback Hydra prints, the bar's own figures)."""
    if not logger.isEnabledFor(level):
        return
    record = logger.makeRecord(logger.name, level, "(unknown file)", 0, message, (), sys.exc_info() if exc_info else None)
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if not is_console(handler) and record.levelno >= handler.level:
                handler.handle(record)
        current = current.parent if current.propagate else None
