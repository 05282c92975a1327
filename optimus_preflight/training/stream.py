"""Accumulation windows over an epoch-based DataLoader, with a resumable position."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager, Iterator

from torch.utils.data import DataLoader

from optimus_preflight.errors import UserError
from optimus_preflight.training.epoch_replay import can_skip_by_index, capture_order, order_replayed, seekable_view

_END = object()


@dataclass
class DataPosition:
    epoch: int = 0
    # Samples of this epoch that belong to completed optimizer steps (this rank's
    # shard). Counted in samples, not batches, so a resume may change the batch size.
    samples_consumed: int = 0
    # The RNG states that decided this epoch's order (epoch_replay.capture_order),
    # recorded when its iterator started; None in checkpoints from before they existed.
    order: dict[str, Any] | None = None


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
        should_stop: Callable[[], bool] = lambda: False,
    ):
        self.loader = loader
        self.accumulation_steps = accumulation_steps
        # Wraps each blocking fetch so a stop signal can end a wait on a stuck loader.
        self.interruptible = interruptible
        # Asked between micro-batches: a stop request abandons the window (the step
        # boundary stays clean for a checkpoint). Set by whoever handles stop signals.
        self.should_stop = should_stop
        # Windows committed since this object was made: tells a loop whether the last
        # step completed or was abandoned.
        self.windows_committed = 0
        # position: where reading is (it moves to the next epoch when a window starts
        # one); committed: where it was at the last step boundary, which is what a
        # checkpoint holds. They differ when a stop abandons a window that started an
        # epoch: the checkpoint's RNG state is the boundary's, from before that epoch
        # drew its order, so the position saved with it must be from before too.
        self.position = DataPosition()
        self.committed = DataPosition()
        # Starts the loader's iterator (the data watchdog wraps it to read worker stacks).
        self.open_iterator: Callable[[Any], Iterator[Any]] = iter
        # The loader's own iterator of this epoch (its workers, for the watchdog and a stop).
        self.loader_iterator: Iterator[Any] | None = None
        self._iterator: Iterator[Any] | None = None
        # Set by load_state_dict: the recorded order of the epoch a resume continues.
        self._replay: dict[str, Any] | None = None
        self._start = 0
        self._fetched = 0

    @property
    def batch_size(self) -> int:
        return getattr(self.loader, "batch_size", None) or 1

    def state_dict(self) -> dict[str, Any]:
        committed = self.committed
        state: dict[str, Any] = {"epoch": committed.epoch, "samples_consumed": committed.samples_consumed}
        if committed.order is not None:
            state["order"] = committed.order
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        order = state.get("order")
        self.position = DataPosition(int(state["epoch"]), int(state["samples_consumed"]), order)
        self.committed = replace(self.position)
        self._replay = order
        self._iterator = None

    def detach_iterator(self) -> Iterator[Any] | None:
        """Let go of this epoch's loader iterator (a stop is ending its workers) and return
        it. Used again, the stream restarts the epoch at its committed position, in the
        recorded order, as a resume from its own state would."""
        iterator, self.loader_iterator, self._iterator = self.loader_iterator, None, None
        self._replay = self.position.order
        if getattr(self.loader, "_iterator", None) is iterator and iterator is not None:
            self.loader._iterator = None  # persistent workers: the loader would reuse it
        return iterator

    def _start_epoch(self) -> None:
        """Start the position's epoch: recorded fresh, or replayed after a resume."""
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.position.epoch)
        replay, self._replay = self._replay, None
        if replay is None:
            self.position.order = capture_order(self.loader)
        offset = self.position.samples_consumed
        self._start, self._fetched = offset, 0
        with order_replayed(self.loader, replay):
            iterator = self._iterate_from(offset)
            if replay is not None and offset == 0:
                # In the recorded run the epoch's first batch was read right after its
                # iterator started, before anything else drew from the RNGs: read it
                # under the recorded states too (a dataset may seed itself lazily).
                with self.interruptible():
                    first = next(iterator, _END)
                iterator = iter(()) if first is _END else itertools.chain([first], iterator)
        self._iterator = iterator

    def _iterate_from(self, offset: int) -> Iterator[Any]:
        """An iterator over the epoch that skips its first ``offset`` samples: by
        seeking, by index, or (an IterableDataset, a loader that is not a DataLoader)
        by reading them."""
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_start"):
            sampler.set_start(offset)
            return self._open(self.loader)
        if offset and can_skip_by_index(self.loader):
            view, index_sampler = seekable_view(self.loader, offset, self.batch_size)
            iterator = self._open(view)
            index_sampler.prime()  # the sampler's own draw happens now, under the replayed RNGs
            return iterator
        iterator = self._open(self.loader)
        for _ in range(offset // self.batch_size):
            with self.interruptible():  # one wait per batch, as in training
                if next(iterator, _END) is _END:
                    break
        return iterator

    def _open(self, loader: Any) -> Iterator[Any]:
        self.loader_iterator = self.open_iterator(loader)
        return self.loader_iterator

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
        self.committed = replace(self.position)
        self.windows_committed += 1
