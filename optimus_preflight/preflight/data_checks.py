"""Data checks: the first batch under a timeout, the loader's memory, duplicated samples."""

from __future__ import annotations

import os
import shutil
from typing import Any

import psutil
from torch.utils.data import IterableDataset

from optimus_preflight.preflight.batch_checks import describe_groups, is_map_style, shape_groups
from optimus_preflight.preflight.batches import batch_nbytes, describe_shapes, sample_hashes
from optimus_preflight.preflight.fetch import FetchResult, fetch_batches
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.sizes import dataloader_host_bytes
from optimus_preflight.preflight.snapshot import preserved_data_state

FIRST_BATCH = "data.first_batch"
RAGGED_MARKERS = ("stack expects each tensor to be equal size", "each element in list of batch should be of equal size")
MIB = 1024**2
GIB = 1024**3
# Share of available host RAM the DataLoader may hold (CREDIT's thresholds).
RAM_WARN_FRACTION = 0.5
RAM_ERROR_FRACTION = 0.8
DUPLICATE_FRACTION = 0.5


def _stack_excerpt(frames: list[str], limit: int = 8) -> str:
    """The hanging thread's innermost frames, where the hang is."""
    shown = frames[:limit] + (["..."] if len(frames) > limit else [])
    return "\n".join("    " + line for line in shown)


def describe_hang(result: FetchResult, timeout: float, workers: int) -> tuple[str, str]:
    """(message, fix) for a first batch that did not arrive: where it hangs, and what to do."""
    where = f" Hung at {result.hang_frame}." if result.hang_frame else ""
    leaked = " (the fetch thread could not be stopped)" if result.leaked_thread else ""
    stack = f"\n  Stack, innermost call first:\n{_stack_excerpt(result.hang_stack)}" if result.hang_stack else ""
    message = f"the first batch did not arrive within {timeout:g} s (data.num_workers={workers}){leaked}.{where}{stack}"
    fix = ("Run once with data.num_workers=0 to debug in one process; check that dataset paths and network mounts "
           "respond; try fewer workers; if the first batch is legitimately slow, raise "
           "preflight.first_batch_timeout_s.")
    return message, fix


def ragged_shapes(loader: Any) -> str:
    """The shape signatures among the samples of the loader's first batch, read one by one."""
    dataset = loader.dataset
    if not is_map_style(dataset) or loader.batch_sampler is None:
        return "shapes unknown"
    return describe_groups(shape_groups(dataset, list(next(iter(loader.batch_sampler), []))))


class FirstBatchCheck(Check):
    """Fetch the real first training batch under ``preflight.first_batch_timeout_s``."""

    name = FIRST_BATCH
    stage = Stage.DATA

    def run(self, ctx: Any, findings: Findings) -> None:
        loader = ctx.train_loader
        timeout = float(ctx.cfg.preflight.first_batch_timeout_s)
        workers = getattr(loader, "num_workers", 0)
        # One batch per worker (up to 4) lets data.duplicates compare what workers yield.
        count = min(workers, 4) if workers > 1 and isinstance(loader.dataset, IterableDataset) else 1
        with preserved_data_state(ctx):
            result = fetch_batches(loader, count, timeout)
        findings.data.update(latency_s=result.latency_s, num_workers=workers, batches_fetched=len(result.batches))
        if result.timed_out:
            self._report_hang(result, timeout, workers, findings)
        elif result.error is not None:
            self._report_error(ctx, result, findings)
        elif not result.batches:
            findings.error("DATA_EMPTY", "the training DataLoader yields no batches",
                           "Check the dataset is not empty and data.batch_size <= its size when data.drop_last=true.",
                           "data.train")
        else:
            batch = result.batches[0]
            ctx.artifacts["first_batch"] = batch
            ctx.artifacts["first_batches"] = result.batches
            size = batch_nbytes(batch)
            findings.data.update(batch_bytes=size, shapes=describe_shapes(batch))
            findings.data["summary"] = f"first batch in {result.latency_s:.2f} s, {size / 1024:.1f} KiB"

    @staticmethod
    def _report_hang(result: FetchResult, timeout: float, workers: int, findings: Findings) -> None:
        findings.data["stacks"] = result.stacks
        message, fix = describe_hang(result, timeout, workers)
        findings.error("DATA_TIMEOUT", message, fix, "data.num_workers")

    @staticmethod
    def _report_error(ctx: Any, result: FetchResult, findings: Findings) -> None:
        text = result.error_text or ""
        if any(marker in text for marker in RAGGED_MARKERS):
            with preserved_data_state(ctx):
                shapes = ragged_shapes(ctx.train_loader)
            findings.data["sample_shapes"] = shapes
            findings.error(
                "DP4",
                f"default collate cannot stack the first batch: its samples have different shapes ({shapes})",
                "Pass a collate_fn that pads (torch.nn.utils.rnn.pad_sequence plus a mask, and mask the loss) or "
                "keeps ragged fields as lists; or batch samples of equal length together.",
                "data.train",
            )
            return
        findings.error(
            "DATA_ERROR",
            f"fetching the first batch raised {text.splitlines()[0] if text else 'an error'}",
            "Fix the dataset or collate_fn; data.num_workers=0 gives the full traceback in the main process.",
            "data.train",
        )
        findings.data["error"] = text


class LoaderMemoryCheck(Check):
    """Host RAM and /dev/shm held by in-flight batches, from the measured first batch."""

    name = "data.loader_memory"
    stage = Stage.DATA
    requires = (FIRST_BATCH,)

    def run(self, ctx: Any, findings: Findings) -> None:
        loader = ctx.train_loader
        batch_bytes = batch_nbytes(ctx.artifacts["first_batch"])
        workers = getattr(loader, "num_workers", 0)
        usage = dataloader_host_bytes(batch_bytes, workers, getattr(loader, "prefetch_factor", None), loader.pin_memory)
        available = psutil.virtual_memory().available
        fraction = usage["total_bytes"] / max(available, 1)
        findings.data.update(usage, available_bytes=available, fraction_of_available=round(fraction, 4))
        findings.data["summary"] = (
            f"{usage['batches_in_flight']} batch(es) in flight x {batch_bytes / MIB:.2f} MiB = "
            f"{usage['total_bytes'] / MIB:.1f} MiB ({100 * fraction:.1f}% of available RAM)"
        )
        knobs = ("Lower data.num_workers, data.prefetch_factor or data.batch_size; "
                 "data.pin_memory=false drops the pinned copies.")
        message = (f"the DataLoader will hold ~{usage['total_bytes'] / GIB:.2f} GiB ({workers} workers x "
                   f"prefetch {usage['batches_in_flight'] // max(workers, 1)} x {batch_bytes / MIB:.1f} MiB batches"
                   f"{', pinned copies included' if loader.pin_memory else ''}), {100 * fraction:.0f}% of the "
                   f"{available / GIB:.1f} GiB of available RAM")
        if fraction > RAM_ERROR_FRACTION:
            findings.error("DATA_RAM", message, knobs, "data.num_workers")
        elif fraction > RAM_WARN_FRACTION:
            findings.warning("DATA_RAM", message, knobs, "data.num_workers")
        shm = usage["shared_memory_bytes"]
        if shm and os.path.isdir("/dev/shm"):
            free = shutil.disk_usage("/dev/shm").free
            findings.data["shm_free_bytes"] = free
            shm_message = f"in-flight worker batches need ~{shm / MIB:.0f} MiB of /dev/shm, {free / MIB:.0f} MiB is free"
            shm_fix = ("Enlarge /dev/shm (docker --shm-size=8g or --ipc=host), or use "
                       "torch.multiprocessing.set_sharing_strategy('file_system'), or lower data.num_workers.")
            if shm > free:
                findings.error("DP15", shm_message + ": workers will die with 'Bus error'", shm_fix, "data.num_workers")
            elif shm > 0.5 * free:
                findings.warning("DP15", shm_message, shm_fix, "data.num_workers")


class DuplicateSamplesCheck(Check):
    """DP2: an IterableDataset that is not sharded yields every sample once per worker."""

    name = "data.duplicates"
    stage = Stage.DATA
    requires = (FIRST_BATCH,)

    def run(self, ctx: Any, findings: Findings) -> None:
        batches = ctx.artifacts["first_batches"]
        hashes = [sample_hashes(batch) for batch in batches]
        # Kept for the cross-rank comparison at the end of preflight.
        ctx.artifacts["sample_hashes"] = hashes[0] if hashes else []
        seen: set[str] = set()
        repeated = later = 0
        for index, digests in enumerate(hashes):
            if index:
                later += len(digests)
                repeated += sum(digest in seen for digest in digests)
            seen.update(digests)
        within = len(hashes[0]) - len(set(hashes[0])) if hashes else 0
        findings.data.update(batches_compared=len(hashes), repeated_across_batches=repeated, repeated_in_first=within)
        findings.data["summary"] = f"{len(hashes)} batch(es) hashed, {repeated} repeated samples"
        if later and repeated / later >= DUPLICATE_FRACTION:
            workers = ctx.train_loader.num_workers
            findings.error(
                "DP2",
                f"{repeated} of {later} samples in the first batches of workers 2..{len(hashes)} repeat worker 1's: "
                f"the IterableDataset is not sharded, so each of the {workers} workers yields the whole stream "
                f"(every sample is seen {workers} times per epoch)",
                "Shard inside __iter__: info = torch.utils.data.get_worker_info(); keep items where "
                "index % (info.num_workers * world_size) == rank * info.num_workers + info.id.",
                "data.train",
            )


