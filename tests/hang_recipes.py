"""Char-LM recipes whose data code hangs, one shape each, for the hang tests.

Every hanging function first appends its process id to the file named by $HANG_PIDS
(so a test can show no worker outlives the run), then sleeps on its own line: that
line is the frame preflight must name.
"""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from optimus_preflight.recipes.char_lm import CharLMRecipe

SAMPLES = 64
BATCH = 4
BLOCK = 32
HANG_S = 3600


def record_pid() -> None:
    path = os.environ.get("HANG_PIDS")
    if path:
        with open(path, "a") as handle:
            handle.write(f"{os.getpid()}\n")


def sample(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.arange(index, index + BLOCK + 1) % 90
    return tokens[:-1], tokens[1:]


def pairs(batch):
    inputs, targets = zip(*batch)
    return torch.stack(inputs), torch.stack(targets)


class SleepyItems(Dataset):
    """Every sample hangs."""

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        record_pid()
        time.sleep(HANG_S)


class SleepyIter(IterableDataset):
    """``__iter__`` blocks before it returns an iterator: ``iter(loader)`` itself hangs."""

    def __iter__(self):
        record_pid()
        time.sleep(HANG_S)
        return iter([])


class Healthy(Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        return sample(index)


class HangsAt(Dataset):
    """Healthy except for the samples in ``indices`` (only inside a worker if ``in_worker``)."""

    def __init__(self, indices: range, in_worker: bool = False):
        self.indices = indices
        self.in_worker = in_worker

    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        if index in self.indices and (get_worker_info() is not None or not self.in_worker):
            record_pid()
            time.sleep(HANG_S)
        return sample(index)


def sleepy_collate(batch):
    record_pid()
    time.sleep(HANG_S)


def sleepy_init(worker_id):
    record_pid()
    time.sleep(HANG_S)


class _Loader(CharLMRecipe):
    def loader(self) -> DataLoader:
        raise NotImplementedError

    def build_dataloaders(self):
        return self.loader(), None


class WorkerGetitem(_Loader):
    def loader(self):
        return DataLoader(SleepyItems(), batch_size=BATCH, num_workers=1)


class MainGetitem(_Loader):
    def loader(self):
        return DataLoader(SleepyItems(), batch_size=BATCH, num_workers=0)


class IterMain(_Loader):
    def loader(self):
        return DataLoader(SleepyIter(), batch_size=BATCH, num_workers=0)


class IterWorkers(_Loader):
    def loader(self):
        return DataLoader(SleepyIter(), batch_size=BATCH, num_workers=2)


class Collate(_Loader):
    def loader(self):
        return DataLoader(Healthy(), batch_size=BATCH, collate_fn=sleepy_collate)


class InitFn(_Loader):
    def loader(self):
        return DataLoader(Healthy(), batch_size=BATCH, num_workers=1, worker_init_fn=sleepy_init)


# Hangs that show up only after the first batch arrived.
class ScanHang(_Loader):
    """The last sample hangs: only data.collate's shape scan reads it."""

    def loader(self):
        return DataLoader(HangsAt(range(SAMPLES - 1, SAMPLES)), batch_size=BATCH)


# The throughput burst always reads the 2nd batch (its first timed step), however slow
# the machine; the LR range test reads it right after the stored first batch.
class BurstHangMain(_Loader):
    """The 2nd batch's samples hang in this process (its own collate_fn: the shape scan does
    not apply); data.collate_order reads them by index first."""

    def loader(self):
        return DataLoader(HangsAt(range(BATCH, 2 * BATCH)), batch_size=BATCH, collate_fn=pairs)


class BurstHangWorker(_Loader):
    """The 2nd batch hangs, only when a worker reads it (the shape scan reads it fine)."""

    def loader(self):
        return DataLoader(HangsAt(range(BATCH, 2 * BATCH), in_worker=True), batch_size=BATCH, num_workers=1)


class HangsOnSecondCall:
    """A collate_fn whose second call on a loader batch hangs: only iterating the DataLoader
    makes batches of BATCH samples (data.collate_order collates more samples at once), and
    the LR range test reads the 2nd batch first."""

    def __init__(self):
        self.calls = 0

    def __call__(self, batch):
        self.calls += len(batch) == BATCH
        if self.calls == 2:
            record_pid()
            time.sleep(HANG_S)
        return pairs(batch)


class LRFinderHang(_Loader):
    def loader(self):
        return DataLoader(Healthy(), batch_size=BATCH, collate_fn=HangsOnSecondCall())
