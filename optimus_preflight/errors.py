"""Exceptions that carry an exit code, and the exit codes of docs/ARCHITECTURE.md."""

from __future__ import annotations

import errno
import signal

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USER_ERROR = 2
EXIT_PREFLIGHT_FAILED = 3


class UserError(Exception):
    """A problem the user fixes in config or input: shown as one message, exit 2.

    ``str()`` gives: what is wrong, the config key involved, and the fix.
    """

    exit_code = EXIT_USER_ERROR

    def __init__(self, message: str, *, key: str | None = None, fix: str | None = None):
        self.message = message
        self.key = key
        self.fix = fix
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = self.message
        if self.key and self.key not in text:
            text = f"{self.key}: {text}"
        if self.fix:
            text = f"{text.rstrip('.')}. {self.fix}"
        return text


# What a disk, not the code, answers: read-only, full, over quota, not ours to write.
STORAGE_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EIO})


def is_storage_error(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in STORAGE_ERRNOS


class StorageError(UserError):
    """The disk refused a file the run must write (full, read-only, gone): the run stops
    with one message instead of a chain of tracebacks."""

    @classmethod
    def from_os_error(cls, error: OSError, what: str, directory: object, detail: str = "") -> StorageError:
        cause = errno.errorcode.get(error.errno or 0, type(error).__name__)
        return cls(
            f"could not write {what} in {directory}: {error.strerror or error} ({cause}).{' ' + detail if detail else ''}",
            key="hydra.run.dir",
            fix="Free space on that disk (df -h) or make the directory writable, then resume with "
            "checkpoint.resume=auto; or run in a hydra.run.dir on a disk with room.",
        )


class TrainingDiverged(UserError):
    """Too many consecutive optimizer steps had non-finite gradients."""


class PreflightFailed(Exception):
    """The preflight verdict is 'failed' under the configured policy: exit 3."""

    exit_code = EXIT_PREFLIGHT_FAILED

    def __init__(self, report):
        self.report = report
        super().__init__("preflight failed; see the report above and preflight.json")


class TrainingInterrupted(SystemExit):
    """A stop signal was handled: a checkpoint was saved, exit 128 + signal number.

    A ``SystemExit`` (code 128 + signal): a loop of the user's own that does not catch it
    ends with that status and no traceback, and ``except Exception`` cannot swallow it.
    """

    def __init__(self, signum: int, step: int, checkpoint: str | None, chained_handler=None):
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        self.exit_code = 128 + signum
        # A handler that owned the signal before us (a scheduler's requeue logic), to be
        # called once the run has shut down cleanly.
        self.chained_handler = chained_handler
        super().__init__(self.exit_code)

    def __str__(self) -> str:
        return f"interrupted by signal {self.signum} at step {self.step}; checkpoint: {self.checkpoint}"

    @property
    def reason(self) -> str:
        """Why the run stopped, in a few words (summary.json's ``stop_reason``)."""
        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        return f"stopped by {name} at step {self.step}"


class DataStalled(TrainingInterrupted):
    """No training batch came within the data watchdog's timeout: the run stopped at the
    last step boundary with a checkpoint. Exit 2, a user error (the data code hangs),
    and, like any stop, a ``SystemExit``: no traceback, the message was logged."""

    def __init__(self, message: str, step: int, checkpoint: str | None, headline: str = ""):
        SystemExit.__init__(self, EXIT_USER_ERROR)
        self.headline = headline
        self.signum = None
        self.step = step
        self.checkpoint = checkpoint
        self.exit_code = EXIT_USER_ERROR
        self.chained_handler = None
        self.message = message

    def __str__(self) -> str:
        return self.message

    @property
    def reason(self) -> str:
        return f"data stalled at step {self.step}: {self.headline or self.message}"
