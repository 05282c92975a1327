"""Accumulation windows over an epoch-based DataLoader, with a resumable position."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

from torch.utils.data import DataLoader

from optimus_preflight.errors import UserError


@dataclass
class DataPosition:
    epoch: int = 0
    # Samples of this epoch that belong to completed optimizer steps (this rank's
    # shard). Counted in samples, not batches, so a resume may change the batch size.
    samples_consumed: int = 0


class BatchStream:
    """Hands out one accumulation window of micro-batches at a time.

    A window never crosses an epoch boundary, so the last window of an epoch may be
    short; it is what makes B x K accumulation see exactly the batches of a B*K run.
    The position advances only when a window is committed (after the optimizer step),
    so an interrupted window is replayed on resume, never counted as done.
    """

    def __init__(
        self,
        loader: DataLoader,
        accumulation_steps: int,
        interruptible: Callable[[], ContextManager] = contextlib.nullcontext,
    ):
        self.loader = loader
        self.accumulation_steps = accumulation_steps
        # Wraps each blocking fetch so a stop signal can end a wait on a stuck loader.
        self.interruptible = interruptible
        self.position = DataPosition()
        self._iterator: Iterator[Any] | None = None
        self._start = 0
        self._fetched = 0
        generator = getattr(loader, "generator", None)
        self._generator_seed = generator.initial_seed() if generator is not None else None

    @property
    def batch_size(self) -> int:
        return self.loader.batch_size or 1

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.position.epoch, "samples_consumed": self.position.samples_consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = DataPosition(int(state["epoch"]), int(state["samples_consumed"]))
        self._iterator = None

    def _start_epoch(self) -> None:
        sampler = self.loader.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.position.epoch)
        if self._generator_seed is not None:
            # Worker seeds are drawn from this generator when an iterator starts; tying
            # them to the epoch makes them the same in a resumed run.
            self.loader.generator.manual_seed(self._generator_seed + self.position.epoch)
        offset = self.position.samples_consumed
        skip_batches = 0
        if hasattr(sampler, "set_start"):
            sampler.set_start(offset)
        else:  # a sampler that cannot seek is fast-forwarded by reading its batches
            skip_batches = offset // self.batch_size
        self._iterator = iter(self.loader)
        self._start, self._fetched = offset, 0
        for _ in range(skip_batches):
            next(self._iterator)

    def _fetch(self) -> Any | None:
        try:
            with self.interruptible():
                batch = next(self._iterator)
        except StopIteration:
            return None
        self._fetched += 1
        return batch

    def window(self) -> Iterator[tuple[Any, bool]]:
        """Yield ``(micro_batch, is_last)``; the next batch is read before the current
        one is handed out, so ``is_last`` is known in time for DDP's ``no_sync``."""
        if self._iterator is None:
            self._start_epoch()
        pending = self._fetch()
        if pending is None:
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._start_epoch()
            pending = self._fetch()
            if pending is None:
                raise UserError(
                    "the training DataLoader produced no batches",
                    key="data.train",
                    fix="Check the dataset is not empty, and that data.batch_size is not larger "
                    "than the dataset when data.drop_last=true.",
                )
        for index in range(self.accumulation_steps):
            upcoming = self._fetch() if index + 1 < self.accumulation_steps else None
            yield pending, upcoming is None
            if upcoming is None:
                return
            pending = upcoming

    def commit(self) -> None:
        """Mark every batch handed out so far as consumed by a completed step. (The
        epoch's short last batch may overcount; the next fetch then ends the epoch.)"""
        self.position.samples_consumed = self._start + self._fetched * self.batch_size
