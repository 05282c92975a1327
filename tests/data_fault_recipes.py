"""Char-LM recipes whose training data misbehaves mid-training, for the data watchdog,
the one-Ctrl+C exit and the error-context tests.

Environment:
- STALL_AT_READ=N: the N-th sample a process (the main one or each worker) reads
  blocks for an hour, on its own line (the frame the watchdog must name), after
  appending its pid to $HANG_PIDS. STALL_VAL_AT_READ=N: the same in the validation data.
  STALL_RANK=R: under torchrun, only rank R's data stalls.
- STOP_WORKER_AT_STEP=N: at training step N, SIGSTOP DataLoader worker 0 (its pid is
  written to $STOPPED_PID); with CTRL_C_FILE=<path>, once the main thread waits for a
  batch (its stack sits in torch's data queue), send this process one SIGINT and write
  the time.monotonic() it was sent to <path>.
- RAISE_AT_READ=N: the N-th sample a process reads raises ValueError("sample <index> is corrupt").
- RAISE_IN_BUILDER=build_model|build_optimizer|build_dataloaders: that builder raises.
- HANG_AT_EXIT=1: an exit handler blocks for an hour (as a join of a worker that never
  ends would) and, once the main thread sits in it, this process gets one SIGINT
  (CTRL_C_TO_THREAD=1: delivered to another thread than the main one).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time

from torch.utils.data import Dataset

from optimus_preflight.recipes.char_lm import CharLMRecipe
from optimus_preflight.training.loaders import build_loader

HANG_S = 3600


def _record_pid() -> None:
    path = os.environ.get("HANG_PIDS")
    if path:
        with open(path, "a") as handle:
            handle.write(f"{os.getpid()}\n")


class FaultyWindows(Dataset):
    """The recipe's own samples, with the fault the environment asks for."""

    def __init__(self, inner: Dataset, stall_at: int = 0, raise_at: int = 0):
        self.inner = inner
        self.reads = 0
        self.stall_at = stall_at
        self.raise_at = raise_at

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index):
        self.reads += 1
        if self.reads == self.stall_at:
            _record_pid()
            time.sleep(HANG_S)
        if self.reads == self.raise_at:
            raise ValueError(f"sample {index} is corrupt")
        return self.inner[index]


def _waiting_for_data(ident: int) -> bool:
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_name == "_try_get_data":
            return True
        frame = frame.f_back
    return False


def _ctrl_c_once_waiting(path: str) -> None:
    main = threading.main_thread().ident

    def send() -> None:
        while not _waiting_for_data(main):
            time.sleep(0.01)  # the event: the main thread waits on the stopped worker
        with open(path, "w") as handle:
            handle.write(repr(time.monotonic()))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=send, daemon=True).start()


def _hang_at_exit() -> None:
    time.sleep(HANG_S)


def _ctrl_c_once_exiting() -> None:
    main = threading.main_thread().ident
    to_this_thread = os.environ.get("CTRL_C_TO_THREAD") == "1"

    def send() -> None:
        while not _in_function(main, _hang_at_exit.__code__):
            time.sleep(0.01)  # the event: the main thread sits in the exit handler
        if to_this_thread:  # as the kernel may deliver a process's SIGINT to any of its threads
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        else:
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=send, daemon=True).start()


def _in_function(ident: int, code) -> bool:
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


class FaultyDataRecipe(CharLMRecipe):
    def build_model(self):
        self._maybe_raise("build_model")
        if os.environ.pop("HANG_AT_EXIT", None) == "1":
            atexit.register(_hang_at_exit)
            _ctrl_c_once_exiting()
        return super().build_model()

    def build_optimizer(self, model):
        self._maybe_raise("build_optimizer")
        return super().build_optimizer(model)

    def build_dataloaders(self):
        self._maybe_raise("build_dataloaders")
        train, val = super().build_dataloaders()
        dist = self.training_context.dist
        options = dict(seed=self.cfg.trainer.seed, rank=dist.rank, world_size=dist.world_size)
        stalls = os.environ.get("STALL_RANK") in (None, str(dist.rank))
        train = build_loader(FaultyWindows(train.dataset, int(os.environ.get("STALL_AT_READ", "0")) if stalls else 0,
                                           int(os.environ.get("RAISE_AT_READ", "0"))), self.cfg.data, train=True, **options)
        val = build_loader(FaultyWindows(val.dataset, int(os.environ.get("STALL_VAL_AT_READ", "0"))), self.cfg.data,
                           train=False, **options)
        return train, val

    @staticmethod
    def _maybe_raise(builder: str) -> None:
        if os.environ.get("RAISE_IN_BUILDER") == builder:
            raise RuntimeError(f"{builder} failed on purpose")

    def compute_loss(self, model, batch):
        at = int(os.environ.get("STOP_WORKER_AT_STEP", "0"))
        if at and model.training and self.state.step + 1 == at:
            os.environ["STOP_WORKER_AT_STEP"] = "0"
            worker = self.batches.loader_iterator._workers[0]
            os.kill(worker.pid, signal.SIGSTOP)
            if os.environ.get("STOPPED_PID"):
                with open(os.environ["STOPPED_PID"], "w") as handle:
                    handle.write(str(worker.pid))
            if os.environ.get("CTRL_C_FILE"):
                _ctrl_c_once_waiting(os.environ["CTRL_C_FILE"])
        return super().compute_loss(model, batch)
