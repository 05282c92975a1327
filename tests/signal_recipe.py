"""A char-LM recipe that sends itself a real signal at a chosen point, for resume tests.

Environment: SIGNAL_NAME (e.g. SIGTERM), SIGNAL_PHASE (train|eval|data|preflight, the
last counting training samples read by the preflight), SIGNAL_AT
(1-based count of compute_loss calls in that phase, or of training samples read) and
SIGNAL_REPEAT (how many times to send it; 2 x SIGINT is an impatient user),
SIGNAL_RANK (under torchrun, the only rank that sends it) and SIGNAL_GROUP=1 (send it
to the whole process group, DataLoader workers included, as a terminal's Ctrl+C does).
SIGNAL_SECOND_IN_OP=<path>: send the signal once, then once more while the main thread
sits inside a C++ call that lasts SIGNAL_OP_S seconds (default 60), writing the
time.monotonic() of that second signal to <path>.
PID_DIR=<dir>: each rank writes rank<N>.pid there in its third training step.
STOP_AT_SAVE_RANK=<rank>: that rank SIGSTOPs itself as it enters its first checkpoint
save, so its peers wait for it at the barrier after the save.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

from optimus_preflight.recipes.char_lm import CharLMRecipe


def _plan():
    name = os.environ.get("SIGNAL_NAME")
    if not name or os.environ.get("SIGNAL_RANK", os.environ.get("RANK", "0")) != os.environ.get("RANK", "0"):
        return None
    return getattr(signal, name), os.environ["SIGNAL_PHASE"], int(os.environ["SIGNAL_AT"])


class _SignallingDataset(Dataset):
    def __init__(self, inner, signum, at, armed):
        self.inner, self.signum, self.at, self.armed, self.reads = inner, signum, at, armed, 0

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        self.reads += self.armed()
        if self.armed() and self.reads == self.at:
            os.kill(os.getpid(), self.signum)  # arrives while the loop waits for data
        return self.inner[index]


def _main_thread_at(ident, code, line) -> bool:
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code is code and frame.f_lineno == line:
            return True
        frame = frame.f_back
    return False


def _signal_inside_a_long_cpp_call(signum, marker: Path, duration_s: float) -> None:
    """Block the main thread in one C++ call, as a long backward or matmul does (no
    bytecode runs, the GIL is released), but for a fixed time on any machine; a helper
    thread sends ``signum`` once the main thread is in it."""
    done = torch.futures.Future()
    main = threading.main_thread().ident
    waiting: dict[str, int] = {}

    def send() -> None:
        while not _main_thread_at(main, _signal_inside_a_long_cpp_call.__code__, waiting.get("line")):
            time.sleep(0.01)  # the event: the main thread's stack sits on the blocking call
        marker.write_text(repr(time.monotonic()))
        os.kill(os.getpid(), signum)

    threading.Thread(target=send, daemon=True).start()
    finish = threading.Timer(duration_s, done.set_result, (None,))
    finish.daemon = True
    finish.start()
    waiting["line"] = sys._getframe().f_lineno + 1
    done.wait()
    marker.with_suffix(".finished").write_text("the call ran to its end")


class SelfSignalRecipe(CharLMRecipe):
    calls = {"train": 0, "eval": 0}

    def setup_interruption(self, **objects):
        interruption = super().setup_interruption(**objects)
        if os.environ.get("STOP_AT_SAVE_RANK") == os.environ.get("RANK", "0"):
            save = interruption.save

            def stop_then_save():
                os.kill(os.getpid(), signal.SIGSTOP)
                return save()

            interruption.save = stop_then_save
        return interruption

    def build_dataloaders(self):
        train, val = super().build_dataloaders()
        plan = _plan()
        if plan and plan[1] in ("data", "preflight"):
            in_preflight = plan[1] == "preflight"
            armed = lambda: (self.preflight_report is None) == in_preflight  # noqa: E731
            wrapped = _SignallingDataset(train.dataset, plan[0], plan[2], armed)
            train = type(train)(
                wrapped, batch_size=train.batch_size, sampler=train.sampler, generator=train.generator
            )
        return train, val

    def compute_loss(self, model, batch):
        pid_dir = os.environ.get("PID_DIR")
        if pid_dir and model.training and self.state.step == 2 and (self.preflight_report is not None or not self.cfg.preflight.enabled):
            path = Path(pid_dir) / f"rank{os.environ.get('RANK', '0')}.pid"
            if not path.exists():
                path.write_text(str(os.getpid()))
        plan = _plan()
        phase = "train" if model.training else "eval"
        # Preflight's own steps do not count: the signal targets the training loop.
        if plan and self.preflight_report is not None:
            self.calls[phase] += 1
            if plan[1] == phase and self.calls[phase] == plan[2] and os.environ.get("SIGNAL_SECOND_IN_OP"):
                os.kill(os.getpid(), plan[0])
                _signal_inside_a_long_cpp_call(plan[0], Path(os.environ["SIGNAL_SECOND_IN_OP"]), float(os.environ.get("SIGNAL_OP_S", "60")))
            elif plan[1] == phase and self.calls[phase] == plan[2]:
                for _ in range(int(os.environ.get("SIGNAL_REPEAT", "1"))):
                    if os.environ.get("SIGNAL_GROUP") == "1":
                        os.killpg(os.getpgrp(), plan[0])
                    else:
                        os.kill(os.getpid(), plan[0])
        return super().compute_loss(model, batch)
