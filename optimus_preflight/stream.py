"""Accumulation windows over an epoch-based DataLoader, with a resumable position."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from torch.utils.data import DataLoader

from optimus_preflight.errors import UserError


@dataclass
class DataPosition:
    epoch: int = 0
    # Batches of this epoch that belong to completed optimizer steps.
    batches_consumed: int = 0


class BatchStream:
    """Hands out one accumulation window of micro-batches at a time.

    A window never crosses an epoch boundary, so the last window of an epoch may be
    short; it is what makes B x K accumulation see exactly the batches of a B*K run.
    The position advances only when a window is committed (after the optimizer step),
    so an interrupted window is replayed on resume, never counted as done.
    """

    def __init__(self, loader: DataLoader, accumulation_steps: int):
        self.loader = loader
        self.accumulation_steps = accumulation_steps
        self.position = DataPosition()
        self._iterator: Iterator[Any] | None = None
        self._fetched = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.position.epoch, "batches_consumed": self.position.batches_consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = DataPosition(int(state["epoch"]), int(state["batches_consumed"]))
        self._iterator = None

    def _start_epoch(self) -> None:
        sampler = self.loader.sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.position.epoch)
        skip = self.position.batches_consumed
        if hasattr(sampler, "set_start"):
            sampler.set_start(skip * (self.loader.batch_size or 1))
            skip = 0
        self._iterator = iter(self.loader)
        self._fetched = self.position.batches_consumed
        # A sampler that cannot seek is fast-forwarded by reading the batches.
        for _ in range(skip):
            next(self._iterator)

    def _fetch(self) -> Any | None:
        try:
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
        """Mark every batch handed out so far as consumed by a completed step."""
        self.position.batches_consumed = self._fetched
