"""Data plumbing: a resumable seeded sampler, loader construction, batch helpers."""

from __future__ import annotations

import signal
import sys
import threading
import traceback
import warnings
from typing import Any, Callable, Iterator, Sized

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from optimus_preflight.config.schema import DataConfig
from optimus_preflight.training.error_context import name_failing_samples


class ResumableSampler(Sampler[int]):
    """A seeded per-epoch permutation, sharded across ranks, that can start mid-epoch.

    The order depends only on (seed, epoch), so batch 16 x 1 step and batch 4 x 4
    accumulation see the same samples, and a resumed run continues with the next
    unseen sample instead of replaying or skipping any.
    """

    def __init__(
        self,
        dataset: Sized,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.num_samples = len(dataset)
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_start(self, start: int) -> None:
        """Skip the first ``start`` samples of this rank's shard (not re-read, just skipped)."""
        self.start = start

    def _shard(self) -> torch.Tensor:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        # Pad by wrapping around so every rank gets the same number of samples, as
        # DistributedSampler does; unequal counts would hang the last collective.
        per_rank = -(-self.num_samples // self.world_size)
        padding = per_rank * self.world_size - self.num_samples
        if padding:
            order = torch.cat([order, order[:padding]])
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._shard()[self.start :].tolist())

    def __len__(self) -> int:
        per_rank = -(-self.num_samples // self.world_size)
        return max(per_rank - self.start, 0)


def ignore_sigint_in_worker(_worker_id: int) -> None:
    # Ctrl+C reaches the whole process group; the main process handles it and shuts
    # the workers down, so a worker's KeyboardInterrupt traceback is only noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _from_fd_sharer(args: threading.ExceptHookArgs) -> bool:
    return _raised_in_fd_sharer(args.exc_traceback)


def _raised_in_fd_sharer(tb: Any) -> bool:
    frames = traceback.extract_tb(tb) if tb else []
    return any(frame.filename.endswith("resource_sharer.py") for frame in frames)


def quiet_orphaned_fd_sharer() -> None:
    """A worker hands each batch's tensors to the main process through a file-descriptor
    server thread (multiprocessing.resource_sharer). When the main process exits while it
    is fetching one (a stop, a worker death it reported), that thread's accept() fails
    with a connection reset and prints a traceback on the terminal after the run's own
    message. The batch has no reader any more, so the error is dropped; any other thread's
    exception is reported as before."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if issubclass(args.exc_type, ConnectionError) and _from_fd_sharer(args):
            return
        previous(args)

    threading.excepthook = hook
    # The server loop itself reports a failed accept() through sys.excepthook.
    previous_sys = sys.excepthook

    def sys_hook(exc_type: Any, exc: Any, tb: Any) -> None:
        if issubclass(exc_type, ConnectionError) and _raised_in_fd_sharer(tb):
            return
        previous_sys(exc_type, exc, tb)

    sys.excepthook = sys_hook


class _WorkerInit:
    """ignore_sigint_in_worker, quiet_orphaned_fd_sharer and name_failing_samples, then
    the user's worker_init_fn (picklable for spawn)."""

    def __init__(self, user_init: Callable[[int], None] | None):
        self.user_init = user_init

    def __call__(self, worker_id: int) -> None:
        ignore_sigint_in_worker(worker_id)
        quiet_orphaned_fd_sharer()
        name_failing_samples()
        if self.user_init is not None:
            self.user_init(worker_id)


# Decided by build_loader itself: the resumable sampler and the sizes from the config.
_OWN_OPTIONS = ("sampler", "batch_sampler", "shuffle", "batch_size", "drop_last", "generator")


def build_loader(
    dataset: Dataset,
    cfg: DataConfig,
    *,
    train: bool,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    **loader_options: Any,
) -> DataLoader:
    """A DataLoader with a ResumableSampler (seeded, sharded, seekable) and the config's
    sizes. Any other DataLoader option passes through (``collate_fn``, ``timeout``,
    ``multiprocessing_context``, ``worker_init_fn``: run after the SIGINT guard, ...)."""
    clashing = sorted(set(loader_options) & set(_OWN_OPTIONS))
    if clashing:
        raise TypeError(f"build_loader sets {', '.join(clashing)} itself (from the data config and its resumable "
                        "sampler); build a DataLoader directly to choose them")
    sampler = ResumableSampler(
        dataset,
        shuffle=cfg.shuffle and train,
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    workers = loader_options.pop("num_workers", cfg.num_workers)
    user_init = loader_options.pop("worker_init_fn", None)
    options: dict[str, Any] = {
        "pin_memory": cfg.pin_memory,
        "prefetch_factor": cfg.prefetch_factor if workers > 0 else None,
        "persistent_workers": cfg.persistent_workers and workers > 0,
        **loader_options,
    }
    with warnings.catch_warnings():
        # The preflight's env.cpu_cores check names data.num_workers and the fix; torch
        # would say it once more here (and again at iteration).
        warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker processes in total", category=UserWarning)
        return DataLoader(
            dataset,
            batch_size=cfg.batch_size if train else (cfg.eval_batch_size or cfg.batch_size),
            sampler=sampler,
            num_workers=workers,
            drop_last=cfg.drop_last and train,
            worker_init_fn=_WorkerInit(user_init) if workers > 0 else user_init,
            # Worker seeds come from this generator, so they do not depend on how much of
            # the global RNG the model's initialisation consumed.
            generator=torch.Generator().manual_seed(seed),
            **options,
        )
