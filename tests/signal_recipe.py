"""A char-LM recipe that sends itself a real signal at a chosen point, for resume tests.

Environment: SIGNAL_NAME (e.g. SIGTERM), SIGNAL_PHASE (train|eval|data|preflight, the
last counting training samples read by the preflight), SIGNAL_AT
(1-based count of compute_loss calls in that phase, or of training samples read) and
SIGNAL_REPEAT (how many times to send it; 2 x SIGINT is an impatient user),
SIGNAL_RANK (under torchrun, the only rank that sends it) and SIGNAL_GROUP=1 (send it
to the whole process group, DataLoader workers included, as a terminal's Ctrl+C does).
"""

from __future__ import annotations

import os
import signal

from optimus_preflight.recipes.char_lm import CharLMRecipe
from torch.utils.data import Dataset


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


class SelfSignalRecipe(CharLMRecipe):
    calls = {"train": 0, "eval": 0}

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
        plan = _plan()
        phase = "train" if model.training else "eval"
        # Preflight's own steps do not count: the signal targets the training loop.
        if plan and self.preflight_report is not None:
            self.calls[phase] += 1
            if plan[1] == phase and self.calls[phase] == plan[2]:
                for _ in range(int(os.environ.get("SIGNAL_REPEAT", "1"))):
                    if os.environ.get("SIGNAL_GROUP") == "1":
                        os.killpg(os.getpgrp(), plan[0])
                    else:
                        os.kill(os.getpid(), plan[0])
        return super().compute_loss(model, batch)
