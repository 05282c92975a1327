"""Ending the process at once, from whichever thread notices first: a second Ctrl+C, or
a torchrun peer that stopped answering.

The main thread may sit inside one long C++ op (a backward, a collective, torch.save)
for seconds or for good, so the exit cannot wait for it: it runs once, on the thread
that got there first, and ends with ``os._exit`` (no unwinding, no atexit, no join).
Every step swallows its own errors, and a timer ends the process anyway if a step hangs
(a full or hung disk). Checkpoints are written atomically, so the previous one stays
valid whatever the main thread was doing.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

from optimus_preflight.config.invocation import speaker

Step = tuple[str, Callable[[], object]]


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def second_ctrl_c_message(last_checkpoint: Path | None, resume: str) -> str:
    """One line: what is on disk and the command that continues from it."""
    if last_checkpoint is None:
        return f"{speaker()}: interrupted twice: stopped at once; no checkpoint on disk yet. Start again with: {resume}"
    return f"{speaker()}: interrupted twice: stopped at once; the last checkpoint on disk is {last_checkpoint} (intact). Resume with: {resume}"


class ForcedExit:
    """Runs the steps of an immediate exit once, then ``exit_process(code)``.

    ``last_words`` run after the caller's steps, with the run's status (summary.json,
    a metrics flush): registered once by the wiring, shared by every kind of forced exit.
    """

    def __init__(self, *, grace_s: float = 10.0, exit_process: Callable[[int], object] = os._exit):
        self.grace_s = grace_s
        self.last_words: list[Callable[[str], object]] = []
        self._exit_process = exit_process
        self._claimed = threading.Lock()
        self._done = threading.Event()

    @property
    def started(self) -> bool:
        return self._claimed.locked()

    def run(self, code: int, status: str, steps: Sequence[Step] = (), *, grace_s: float | None = None) -> None:
        if not self._claimed.acquire(blocking=False):
            # Another thread is already exiting and ends this one too; returning could
            # let this thread start work the exit is about to cut short.
            self._done.wait()
            return
        # The process ends after grace_s even if a step below hangs.
        timer = threading.Timer(grace_s if grace_s is not None else self.grace_s, self._exit_process, (code,))
        timer.daemon = True
        timer.start()
        named = [*steps, *((f"last words {i}", lambda word=word: word(status)) for i, word in enumerate(self.last_words))]
        for name, step in named:
            try:
                step()
            except BaseException as error:  # noqa: BLE001 - nothing may stop the exit
                _try(say, f"{speaker()}: while exiting: {name} failed: {error!r}")
        _try(sys.stdout.flush)
        _try(sys.stderr.flush)
        self._exit_process(code)
        timer.cancel()  # reached only when exit_process returns (tests)
        self._done.set()


def _try(function: Callable[..., object], *args: object) -> None:
    try:
        function(*args)
    except BaseException:  # noqa: BLE001 - a closed or broken stream must not stop the exit
        pass
