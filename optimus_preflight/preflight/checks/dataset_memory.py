"""DP9: a dataset that keeps every sample it reads (an unbounded ``self.cache[idx] = ...``).

Host memory then grows by a sample per new index until the process is killed, once per
worker that keeps its own copy. Measured by reading rounds of fresh samples in this
process (under the data guard) and measuring what stays: anonymous RSS (a memory-mapped
dataset's page cache does not count: the OS reclaims it) and glibc's bytes in use
(which see growth that reused free pages hide from RSS). Only growth that repeats in
every round counts; it is then projected to the samples this run reads, per copy.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import operator
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import psutil

from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, SkipCheck, Stage, StopCheck
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import batch_size_of

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIB = 1024**2
GIB = 1024**3
# A warm-up read absorbs first-touch costs (lazy opens, allocator pools), then ROUNDS
# rounds of PER_ROUND fresh samples; each round must retain RETAIN_FLOOR_BYTES or more,
# and the rounds must agree within a factor of 2, before anything is reported.
WARMUP_SAMPLES = 8
ROUNDS = 3
PER_ROUND = 16
RETAIN_FLOOR_BYTES = 64 * 1024
CACHE_BUDGET_S = 3.0
RAM_WARN_FRACTION = 0.5


@lru_cache(maxsize=1)
def _mallinfo2() -> Callable[[], int] | None:
    """glibc's bytes in use (``mallinfo2``: heap in use + mmapped chunks), or None."""
    name = ctypes.util.find_library("c")
    try:
        function = ctypes.CDLL(name).mallinfo2 if name else None
    except (OSError, AttributeError):
        return None
    if function is None:
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(field, ctypes.c_size_t) for field in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                            "fsmblks", "uordblks", "fordblks", "keepcost")]

    function.restype = MallInfo2

    def in_use() -> int:
        info = function()
        return int(info.uordblks + info.hblkhd)

    return in_use


def memory_in_use() -> tuple[int, int]:
    """(anonymous resident bytes, malloc bytes in use or 0) after collecting the garbage.
    Anonymous: RSS less its file-backed pages (psutil's ``shared`` on Linux), which a
    memory-mapped dataset (np.memmap, Arrow) adds as it reads and the OS can reclaim."""
    gc.collect()
    in_use = _mallinfo2()
    info = psutil.Process().memory_info()
    return info.rss - getattr(info, "shared", 0), in_use() if in_use else 0


def growth_per_round(before: tuple[int, int], after: tuple[int, int]) -> int:
    """What a round retained: the larger of the anonymous RSS and the malloc growth (freed
    pages the heap reuses hide growth from RSS; Python's own arenas are not malloc's)."""
    return max(after[0] - before[0], after[1] - before[1], 0)


def steady_growth(growths: list[int], floor: int = RETAIN_FLOOR_BYTES) -> bool:
    """Growth in every round, about the same each time: what a cache does, and what
    allocator noise (one-off jumps, a pool that fills then stops) does not."""
    return len(growths) >= ROUNDS and min(growths) >= floor and 2 * min(growths) >= max(growths)


@dataclass
class Retention:
    growths: list[int]  # bytes retained per round of PER_ROUND samples
    samples: int  # read in the measured rounds

    @property
    def per_sample(self) -> float:
        return sum(self.growths) / max(self.samples, 1)


@contextlib.contextmanager
def young_collections() -> Iterator[None]:
    """Within the block, ``gc.collect()`` scans only the objects created in it (the older
    ones are frozen): milliseconds each, not a pass over the heap (~0.3 s with torch
    loaded). A program that froze objects itself keeps its freeze, and full passes."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def measure_retention(read: Callable[[int], None], indices: list[int], budget_s: float = CACHE_BUDGET_S) -> Retention | None:
    """Read a warm-up set then rounds of fresh indices, measuring after each; None when the
    budget ran out before every round was read."""
    with young_collections():
        return _measure_rounds(read, indices, budget_s)


def _measure_rounds(read: Callable[[int], None], indices: list[int], budget_s: float) -> Retention | None:
    started = time.perf_counter()
    for index in indices[:WARMUP_SAMPLES]:
        read(index)
    previous = memory_in_use()
    growths = []
    for start in range(WARMUP_SAMPLES, WARMUP_SAMPLES + ROUNDS * PER_ROUND, PER_ROUND):
        if time.perf_counter() - started > budget_s:
            return None
        for index in indices[start:start + PER_ROUND]:
            read(index)
        current = memory_in_use()
        growths.append(growth_per_round(previous, current))
        previous = current
    return Retention(growths, ROUNDS * PER_ROUND)


def cached_samples(samples_per_epoch: int, planned: int, workers: int, persistent: bool) -> int:
    """Sample reads that end up cached by the end of the run: one copy of the epoch (split
    among workers that restart every epoch), or with persistent workers up to one copy
    per worker, each keeping every index it is ever given; no more than the run reads."""
    copies = workers if persistent and workers > 1 else 1
    return min(planned, samples_per_epoch * copies)


CACHE_FIX = ("Bound the cache (functools.lru_cache(maxsize=...) or a fixed-size dict), or precompute the decoded data "
             "once into a file read by slices (np.memmap, .npy, Arrow, LMDB), which the OS page cache shares among "
             "workers, instead of keeping every sample in a dict on the dataset.")


class DatasetCacheCheck(Check):
    """DP9: host memory that grows with every new sample read (an unbounded cache)."""

    name = "data.dataset_cache"
    stage = Stage.DATA
    codes = ("DP9",)
    requires = ("data.first_batch",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        dataset = getattr(loader, "dataset", None)
        if not is_map_style(dataset):
            findings.data["summary"] = "not applicable (iterable data)"
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, dataset, what="len(dataset)")
        wanted = WARMUP_SAMPLES + ROUNDS * PER_ROUND
        if size < wanted:
            findings.data["summary"] = f"not measured ({size} samples: too few to tell)"
            return
        # Fresh indices, away from those earlier checks read; a local RNG, not the global one.
        indices = random.Random(0).sample(range(size), wanted)

        def read(index: int) -> None:
            guard.call(operator.getitem, dataset, index, what=f"dataset[{index}]")

        with preserved_data_state(ctx):
            try:
                retention = measure_retention(read, indices)
            except (SkipCheck, StopCheck):
                raise
            except Exception as error:  # a broken sample: data.first_batch or a DataLoader error says it
                findings.data["summary"] = f"not measured (a sample raised {type(error).__name__})"
                return
        if retention is None:
            findings.data["summary"] = "not measured (samples too slow to read within the budget)"
            return
        findings.data.update(retained_per_round=retention.growths, samples_per_round=PER_ROUND)
        if not steady_growth(retention.growths):
            findings.data["summary"] = "no steady growth while reading samples"
            return
        per_sample = retention.per_sample
        workers = getattr(loader, "num_workers", 0)
        persistent = bool(getattr(loader, "persistent_workers", False))
        try:  # this rank's share of an epoch
            per_epoch = guard.call(len, loader.sampler, what="len(sampler)") if loader.sampler is not None else size
        except TypeError:
            per_epoch = size
        batch = getattr(loader, "batch_size", None) or batch_size_of(ctx.artifacts.first_batch) or 1
        planned = ctx.cfg.trainer.max_steps * ctx.cfg.trainer.accumulation_steps * batch
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.training.dist.world_size))
        reads = cached_samples(per_epoch, planned, workers, persistent)
        projected = per_sample * reads * local_ranks
        available = psutil.virtual_memory().available
        fraction = projected / max(available, 1)
        findings.data.update(retained_per_sample=round(per_sample), projected_bytes=round(projected),
                             available_bytes=available)
        findings.data["summary"] = f"{per_sample / 1024:.0f} KiB retained per sample read, ~{projected / GIB:.2f} GiB by the end"
        copies = (f" ({workers} persistent workers each keep their own)" if persistent and workers > 1 else "") + \
                 (f", on each of the {local_ranks} ranks of this host" if local_ranks > 1 else "")
        message = (f"the dataset keeps what it reads: host memory grew by {per_sample / 1024:.0f} KiB per new sample, "
                   f"in each of {ROUNDS} rounds of {PER_ROUND} (+{', +'.join(f'{g / MIB:.1f}' for g in retention.growths)} "
                   f"MiB), as an unbounded cache does. By the end of this run its caches hold {reads} samples{copies}: "
                   f"~{projected / GIB:.1f} GiB, {100 * fraction:.0f}% of the {available / GIB:.1f} GiB available")
        if fraction > 1:
            findings.error("DP9", message + ". The OOM killer ends the run partway (a bare 'Killed', exit 137, or "
                           "'DataLoader worker ... killed by signal: Killed')", CACHE_FIX, None, code_fix=CACHE_FIX)
        elif fraction > RAM_WARN_FRACTION:
            findings.warning("DP9", message, CACHE_FIX, None, code_fix=CACHE_FIX)
