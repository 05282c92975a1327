from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, NoReturn

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.checkpoint import RunCheckpointer
from optimus_preflight.checkpoint.checkpoint_state import Restorable
from optimus_preflight.checkpoint.fetch_watchdog import Stall
from optimus_preflight.checkpoint.peer_watch import PeerWatch
from optimus_preflight.checkpoint.signals import StopRequested
from optimus_preflight.checkpoint.stop_control import StopControl
from optimus_preflight.errors import DataStalled, TrainingInterrupted
from optimus_preflight.mixins.data_workers import describe_stall, open_watched, release_workers
from optimus_preflight.preflight.data_access.worker_stacks import StacksDirectory
from optimus_preflight.reporting.run_log import log_to_files
from optimus_preflight.training.distributed import DistEnv
from optimus_preflight.training.distributed import peers as active_peers
from optimus_preflight.training.run_state import RunState
from optimus_preflight.training.stream import BatchStream
from optimus_preflight.training.training_context import TrainingContext

log = logging.getLogger("optimus_preflight")


def script_resume_command() -> str:
    """A loop of the user's own: the same command again, from the same directory (its
    checkpoints resume by themselves)."""
    return f"cd {shlex.quote(os.getcwd())} && {shlex.join([sys.executable, *sys.argv])}"


class TrainingInterruptionMixin:
    """Ctrl+C, SIGTERM, SIGHUP (unless ignored) and SIGUSR1 become a checkpoint at an
    optimizer-step boundary and exit 128+signal; periodic and final checkpoints; a restart resumes bit-exact.

    ``TrainingInterruptionMixin(save_freq=0, output_path=None, checkpoint_callback=None)``
    (optimus_dl's interface): checkpoints every ``save_freq`` steps (0: only on a stop and
    at the end) under ``output_path/checkpoints``; ``checkpoint_callback(checkpoint_path=,
    iteration=, collective=, **kwargs)`` is called after each one is written (to copy it
    elsewhere, say). In a loop of your own::

        for step in self.training_steps(max_steps, model=model, optimizer=optimizer,
                                        batches=batches, training_context=context):
            self.run_training_iteration(model, optimizer, loss_fn, batches, context)

    ``training_steps`` resumes from the newest checkpoint, installs the signal handlers,
    and at each step boundary saves when due. A stop signal, wherever it arrives (in the
    step, waiting for data, in your code between steps), ends the loop at the next
    boundary with a checkpoint and ``TrainingInterrupted``, a ``SystemExit`` with code
    128+signal: the process ends without a traceback unless you catch it. Running the
    same command again continues the run. The data watchdog (``fetch_timeout_s``,
    default 600; None: off): no batch within that time stops the run the same way, naming
    the frame the data code blocks in (a worker's or the main process's), with
    ``DataStalled`` (exit 2). Either stop ends the loader's workers, so the exit never
    waits on one that hangs. ``handle_training_interruption(iteration,
    collective)`` saves at the current boundary (and calls ``checkpoint_callback``) for a
    loop that stops by itself. Owns ``self.checkpointer`` (saves and resume),
    ``self.stop_control`` (the stop signals, forced exits) and, under torchrun,
    ``self.peer_watch`` (the ranks' stop agreement and the stuck-collective watchdog).
    """

    checkpointer: RunCheckpointer | None = None
    stop_control: StopControl | None = None
    peer_watch: PeerWatch | None = None

    def __init__(
        self,
        save_freq: int = 0,
        output_path: str | Path | None = None,
        checkpoint_callback: Callable[..., None] | None = None,
        *,
        keep_last: int = 3,
        extra_signal: str | None = "SIGUSR1",
        stop_timeout_s: float = 60.0,
        resume: str = "auto",
        resume_hint: Callable[[], str] = script_resume_command,
        fetch_timeout_s: float | None = 600.0,
        fetch_timeout_key: str = "fetch_timeout_s",
    ):
        self.save_freq = save_freq
        self.output_path = Path(output_path) if output_path is not None else None
        self.checkpoint_callback = checkpoint_callback
        # fetch_timeout_key: how the stall message names the setting (the recipe's config key).
        self.interruption_settings = dict(keep_last=keep_last, extra_signal=extra_signal, stop_timeout_s=stop_timeout_s,
                                          resume=resume, resume_hint=resume_hint, fetch_timeout_s=fetch_timeout_s,
                                          fetch_timeout_key=fetch_timeout_key)

    def setup_interruption(
        self,
        *,
        model: nn.Module,
        optimizer: Optimizer,
        batches: BatchStream | Iterable[Any],
        scheduler: Any = None,
        training_context: TrainingContext | None = None,
        run_state: RunState | None = None,
        config: dict[str, Any] | None = None,
        resume: bool = True,
    ) -> RunCheckpointer:
        """Install the stop handlers over these objects and (``resume``) load the newest
        checkpoint into them. ``batches``: ``training_batches(loader)`` (the iteration
        mixin's windows) or the DataLoader itself (read with ``next_batch()``); its
        position is checkpointed, and a stop ends its waits for data. ``config``: stored
        in each checkpoint (a resume lists what changed)."""
        if self.output_path is None:
            raise ValueError("TrainingInterruptionMixin needs output_path: the directory its checkpoints go to")
        settings = self.interruption_settings
        dist = training_context.dist if training_context is not None else DistEnv.from_environment()
        scaler = training_context.scaler if training_context is not None else _disabled_scaler()
        checkpointer = RunCheckpointer(self.output_path, every_n_steps=self.save_freq, keep_last=settings["keep_last"],
                                       dist=dist, config=config or {})
        if not isinstance(batches, BatchStream):
            batches = BatchStream(batches, accumulation_steps=1)
        timeout_s = settings["fetch_timeout_s"]
        self._stacks = StacksDirectory("optimus-data-stacks-") if timeout_s is not None else None
        stream = batches

        def describe(subject: Any, main_stack: traceback.StackSummary) -> Stall:
            if subject is None:
                return describe_stall(stream.loader_iterator, main_stack, self._stacks_made(), timeout_s)
            stall = describe_stall(subject, main_stack, self._stacks_made(), timeout_s)
            stall.what = "evaluation batch"  # watched_batches
            return stall

        stop = StopControl(settings["extra_signal"], dist, resume_hint=settings["resume_hint"],
                           last_checkpoint=checkpointer.last_checkpoint, fetch_timeout_s=timeout_s,
                           describe_stall=describe)
        peers = active_peers() if dist.is_distributed else None
        peer_watch = None if peers is None else PeerWatch(
            peers, stop, stop_timeout_s=settings["stop_timeout_s"], save_last_step=checkpointer.save_last_step,
            last_checkpoint=checkpointer.last_checkpoint, fetch_timeout_key=settings["fetch_timeout_key"])
        if peer_watch is not None:
            checkpointer.after_save = lambda path: peer_watch.after_save(path, is_main=dist.is_main)
        self.checkpointer, self.stop_control, self.peer_watch = checkpointer, stop, peer_watch
        self._window: Iterator[tuple[Any, bool]] | None = None
        batches.interruptible = stop.fetching
        if self._stacks is not None:
            batches.open_iterator = lambda loader: open_watched(loader, self._stacks)
        batches.should_stop = stop.requested_in_window
        checkpointer.start(Restorable(model, optimizer, scheduler, scaler, run_state or RunState(), batches))
        stop.install()
        if peer_watch is not None:
            peer_watch.start()
        if resume:
            checkpointer.resume(settings["resume"])
            checkpointer.mark_boundary()
            checkpointer.settle()
        return checkpointer

    def training_steps(self, max_steps: int, **objects: Any) -> Iterator[int]:
        """The steps still to run, 1-based, from where the last run stopped; see the class
        docstring. ``objects``: ``setup_interruption``'s arguments, when not set up yet."""
        checkpointer = self.checkpointer if not objects else self.setup_interruption(**objects)
        if checkpointer is None:
            raise ValueError("training_steps needs model=, optimizer=, batches= (or setup_interruption first)")
        state, stream = checkpointer.parts.run_state, checkpointer.parts.stream
        try:
            while state.step < max_steps:
                if self.interruption_requested():
                    self.exit_interrupted()
                before = stream.windows_committed
                yield state.step + 1
                self._commit_batches()
                if stream.windows_committed == before and self.stop_control.requested:
                    self.exit_interrupted()  # the step was abandoned: stop at the boundary before it
                state.record_step(True, 0)
                checkpointer.mark_boundary()
                if checkpointer.due(state.step):
                    self._save_and_notify(state.step, None)
            self._save_and_notify(state.step, None)
        finally:
            self.close_interruption()

    def next_batch(self) -> Any:
        """The next training batch, for a step of your own inside ``training_steps``: read
        from the checkpointed position (a resume continues the epoch where it stopped).
        A stop signal during the wait ends the run here, at the last step boundary."""
        stream = self.checkpointer.parts.stream
        while True:
            if self._window is None:
                self._window = _batches_of(stream)
            try:
                return next(self._window)
            except StopRequested:
                self.exit_interrupted()
            except StopIteration:  # the step reads more than one window's worth
                stream.commit()
                self._window = None

    def watched_batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The batches of another loader (an evaluation's), each wait for one interruptible by
        a stop signal and watched by the data watchdog, like the training stream's: a stop
        raises ``StopRequested`` out of the loop over them, and ends the loader's workers."""
        stop = self.stop_control
        iterator = open_watched(loader, self._stacks) if self._stacks is not None else iter(loader)
        try:
            while True:
                with stop.fetching(iterator):
                    batch = next(iterator, _END)
                if batch is _END:
                    return
                yield batch
        finally:
            if stop.requested:
                release_workers(iterator, hung=stop.stall is not None)

    def _commit_batches(self) -> None:
        if self._window is not None:
            self.checkpointer.parts.stream.commit()
            self._window = None

    def interruption_requested(self) -> bool:
        """At a step boundary: has a stop signal arrived (under torchrun: on any rank)?
        A background checkpoint write that failed ends the run here."""
        if self.checkpointer is None:
            return False
        self.checkpointer.raise_if_background_failed()
        self.checkpointer.training_started = True
        if self.peer_watch is not None:
            return self.peer_watch.stop_agreed()
        return self.stop_control.requested

    def stop_requested(self) -> bool:
        """Inside a step (this process only): abandon the window at the next micro-batch."""
        return self.checkpointer is not None and self.stop_control.requested_in_window()

    def add_last_words(self, word: Callable[[str], object]) -> None:
        """What a forced exit (a second Ctrl+C, a silent peer) does before the process
        ends, given the run's status: write summary.json, flush the metric files."""
        self.stop_control.add_last_words(word)

    def handle_training_interruption(self, iteration: int, collective: Any = None, **kwargs: Any) -> Path | None:
        """Save the checkpoint of this step boundary (``iteration`` steps done) and call
        ``checkpoint_callback(checkpoint_path=..., iteration=..., collective=..., **kwargs)``;
        returns the checkpoint's path (None on a rank that does not write)."""
        if self.checkpointer is None:
            raise ValueError("handle_training_interruption before setup_interruption: there is nothing to save")
        state = self.checkpointer.parts.run_state
        if iteration != state.step:
            state.step = iteration
        return self._save_and_notify(iteration, collective, **kwargs)

    def exit_interrupted(self) -> NoReturn:
        """Save this boundary's checkpoint, say how to resume, and raise
        ``TrainingInterrupted`` (exit 128+signal)."""
        checkpointer, stop = self.checkpointer, self.stop_control
        step = checkpointer.parts.run_state.step
        if stop.stall is not None and self.peer_watch is not None:
            # The peers wait for this rank inside the step's collective: no barrier after the save.
            saved = self.peer_watch.stalled(stop.stall.headline())
            path = saved if isinstance(saved, Path) else None
            if path is not None and self.checkpoint_callback is not None:
                self.checkpoint_callback(checkpoint_path=path, iteration=step, collective=None)
            where = f"checkpoint {path}" if path is not None else f"no new checkpoint ({saved})"
        else:
            path = self._save_and_notify(step, None)
            where = f"checkpoint {path}"
        self._release_workers(hung=stop.stall is not None)
        if stop.stall is not None:
            key = self.interruption_settings["fetch_timeout_key"]
            rank = f"rank {checkpointer.dist.rank}: " if self.peer_watch is not None else ""
            message = (f"{rank}{stop.stall.headline()}; stopped at step {step} with {where}. Fix the data code "
                       f"there, or raise {key} if batches are legitimately that slow ({key}=null: no watchdog). "
                       f"Then resume with: {stop.resume_hint()}")
            log_to_files(log, logging.WARNING, "the stalled thread's stack, innermost first:\n  "
                         + "\n  ".join(stop.stall.stack or ["(none)"]))
            log.error("%s: %s", key, message)
            self.close_interruption()
            if self.peer_watch is not None and threading.current_thread() is threading.main_thread():
                # The peers exit first (they cannot leave their collective), and torchrun answers
                # with SIGTERM to this rank, which may still be writing summary.json and the
                # metrics: the job is ending anyway, and torchrun's SIGKILL still bounds it.
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            raise DataStalled(f"{key}: {message}", step, str(path), f"{rank}{stop.stall.headline()}")
        signum = stop.received or signal.SIGINT
        log.warning("stopped by %s at step %d; checkpoint %s. Resume with:\n  %s",
                    signal.Signals(signum).name, step, path, stop.resume_hint())
        chained = stop.signals.chained_handler()
        self.close_interruption()
        raise TrainingInterrupted(signum, step, str(path), chained)

    def close_interruption(self) -> None:
        """Give the signal handlers back (``training_steps`` does this when it ends)."""
        if self.checkpointer is not None and not self.checkpointer.closed:
            self.checkpointer.close()
            if self.peer_watch is not None:
                self.peer_watch.close()
            self.stop_control.uninstall()
        if getattr(self, "_stacks", None) is not None:
            self._stacks.remove()
            self._stacks = None

    def _stacks_made(self) -> str:
        return (self._stacks.created if self._stacks is not None else None) or ""

    def _release_workers(self, *, hung: bool) -> None:
        """A stop: end the training loader's workers now (a stalled or stopped one too), so
        the process's exit does not wait on them. The stream starts fresh ones if used again."""
        iterator = self.checkpointer.parts.stream.detach_iterator()
        if iterator is not None:
            release_workers(iterator, hung=hung)

    def _save_and_notify(self, iteration: int, collective: Any, **kwargs: Any) -> Path | None:
        path = self.checkpointer.save()
        if self.checkpoint_callback is not None and path is not None:
            self.checkpoint_callback(checkpoint_path=path, iteration=iteration, collective=collective, **kwargs)
        return path


_END = object()


def _batches_of(stream: BatchStream) -> Iterator[Any]:
    for batch, _ in stream.window():
        yield batch


def _disabled_scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", enabled=False)
