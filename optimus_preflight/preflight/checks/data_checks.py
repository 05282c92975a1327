"""Data checks: the first batch under a timeout, the loader's memory, duplicated samples."""

from __future__ import annotations

import math
import operator
import os
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil
import torch
from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler, SubsetRandomSampler

from optimus_preflight.preflight.analyses.probe import SEEDED_GENERATORS, SEEDING, seeding_watched
from optimus_preflight.preflight.analyses.sizes import dataloader_host_bytes
from optimus_preflight.preflight.checks.batch_checks import describe_groups, is_map_style, shape_groups
from optimus_preflight.preflight.data_access.fetch import FetchResult, fetch_batches
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.data_access.samples import (
    batch_nbytes,
    describe_shapes,
    input_digests,
    sample_hashes,
)
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

FIRST_BATCH = "data.first_batch"
RAGGED_MARKERS = ("stack expects each tensor to be equal size", "each element in list of batch should be of equal size")
# torchvision's refusals when Normalize meets a PIL image (Normalize before ToTensor) or
# ToTensor meets a tensor (ToTensor applied twice, or after a tensor transform): DP13.
TRANSFORM_ORDER_MARKERS = ("img should be Tensor Image", "tensor is not a torch image",
                           "pic should be PIL Image or ndarray. Got <class 'torch.Tensor'>")
MIB = 1024**2
GIB = 1024**3
# Share of available host RAM the DataLoader may hold before a warning, and before an error.
RAM_WARN_FRACTION = 0.5
RAM_ERROR_FRACTION = 0.8
DUPLICATE_FRACTION = 0.5
# A first batch of at least this many samples whose distinct samples (inputs and targets
# together) are at most this share of it: the dataset serves one sample under many
# indices. A toy task with four distinct rows in a batch of 32 (12.5%) stays quiet.
IDENTICAL_MIN_BATCH = 8
IDENTICAL_MAX_DISTINCT = 0.1
# The first window of batches of a loader that draws each index at most once per epoch: when
# at most this share of what it read is distinct, and the inputs are too rich to repeat by
# chance (non-integer values, or integer rows of FEW_DISTINCT_RICH values or more: token
# ids, pixels), the dataset serves a handful of samples under many indices. Oversampling by
# repeating the minority's rows tenfold keeps ~90% of a batch distinct; a low-cardinality
# categorical table (three binary columns) repeats by nature and is not read.
FEW_DISTINCT_MIN_READ = 32
FEW_DISTINCT_SHARE = 0.5
FEW_DISTINCT_RICH = 8
SHARD_FIX = ("Shard inside __iter__: info = torch.utils.data.get_worker_info(); keep items where "
             "index % (info.num_workers * world_size) == rank * info.num_workers + info.id.")


def ragged_shapes(loader: Any, guard: DataGuard) -> str:
    """The shape signatures among the samples of the loader's first batch, read one by
    one under the guard (the batch sampler and ``dataset[i]`` are user code)."""
    dataset = loader.dataset
    if not is_map_style(dataset) or loader.batch_sampler is None:
        return "shapes unknown"
    indices = guard.call(lambda: list(next(iter(loader.batch_sampler), [])), what="the batch sampler's first batch")
    return describe_groups(shape_groups(dataset, indices, guard))


class FirstBatchCheck(Check):
    """Fetch the real first training batch under ``preflight.first_batch_timeout_s``."""

    name = FIRST_BATCH
    stage = Stage.DATA
    codes = ("DATA_EMPTY", "DATA_ERROR", "DP4", "DP13")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        guard = DataGuard(ctx, self.name, findings)
        guard.skip_if_hung()  # a check of the recipe's own that ran earlier
        workers = getattr(loader, "num_workers", 0)
        # One batch per worker (up to 4) lets data.duplicates compare what workers yield.
        compared = min(workers, 4) if workers > 1 and isinstance(loader.dataset, IterableDataset) else 1
        # step.accumulation needs two samples to split; a micro-batch of one needs a second batch.
        window = 2 if ctx.cfg.trainer.accumulation_steps > 1 and (getattr(loader, "batch_size", None) or 1) < 2 else 1
        with preserved_data_state(ctx):
            result = fetch_batches(loader, max(compared, window), guard.timeout_s)
        findings.data.update(latency_s=result.latency_s, num_workers=workers, batches_fetched=len(result.batches))
        if result.hang is not None:
            guard.fail(result.hang)
        if result.error is not None:
            self._report_error(ctx, result, guard, findings)
        elif not result.batches:
            findings.error("DATA_EMPTY", "the training DataLoader yields no batches",
                           "Check the dataset is not empty and data.batch_size <= its size when data.drop_last=true.",
                           "data.train",
                           code_fix="Check the dataset your build_dataloaders() returns is not empty, and that the "
                                    "DataLoader's batch_size <= its size when drop_last=True.")
        else:
            batch = result.batches[0]
            ctx.artifacts.first_batch = batch
            ctx.artifacts.first_batches = result.batches[:compared]
            ctx.artifacts.window_batches = result.batches
            size = batch_nbytes(batch)
            findings.data.update(batch_bytes=size, shapes=describe_shapes(batch))
            findings.data["summary"] = f"first batch in {result.latency_s:.2f} s, {size / 1024:.1f} KiB"

    @staticmethod
    def _report_error(ctx: PreflightContext, result: FetchResult, guard: DataGuard, findings: Findings) -> None:
        text = result.error_text or ""
        findings.data["error"] = result.error_trace or text
        if any(marker in text for marker in RAGGED_MARKERS):
            with preserved_data_state(ctx):
                shapes = ragged_shapes(ctx.train_loader, guard)
            findings.data["sample_shapes"] = shapes
            pad = ("Pass a collate_fn that pads (torch.nn.utils.rnn.pad_sequence plus a mask, and mask the loss) or "
                   "keeps ragged fields as lists")
            findings.error(
                "DP4",
                f"default collate cannot stack the first batch: its samples have different shapes ({shapes})",
                f"{pad}; or batch samples of equal length together.",
                "data.train",
                code_fix=f"{pad} to the DataLoader your build_dataloaders() returns; or batch samples of equal length "
                         "together.",
            )
            return
        first = text.splitlines()[0] if text else "an error"
        refusal = next((line.strip() for line in text.splitlines() for marker in TRANSFORM_ORDER_MARKERS
                        if marker in line), None)
        if refusal is not None:  # from a worker, the first line only says which worker caught it
            order = ("put ToTensor() before Normalize(mean, std) in the transforms.Compose list (Normalize needs a float "
                     "CHW tensor, ToTensor needs a PIL image or an HxWxC array), and apply ToTensor once")
            findings.error("DP13", f"fetching the first batch raised {refusal}: the dataset's transforms run in "
                                   "the wrong order", f"In the dataset's transform, {order}.", "data.train",
                           code_fix=f"In the transform of the dataset your build_dataloaders() returns, {order}.")
            return
        if getattr(ctx.train_loader, "num_workers", 0) == 0:  # the traceback is already this process's own
            findings.error("DATA_ERROR", f"fetching the first batch raised {first}",
                           "Fix the dataset or collate_fn where the traceback points (preflight.json: this check's "
                           "data.error).")
            return
        findings.error(
            "DATA_ERROR",
            f"fetching the first batch raised {first}",
            "Fix the dataset or collate_fn; data.num_workers=0 gives the full traceback in the main process.",
            "data.num_workers",
            code_fix="Fix the dataset or collate_fn; passing num_workers=0 to the DataLoader your build_dataloaders() "
                     "returns gives the full traceback in the main process.",
        )


class LoaderMemoryCheck(Check):
    """Host RAM and /dev/shm held by in-flight batches, from the measured first batch."""

    name = "data.loader_memory"
    stage = Stage.DATA
    codes = ("DATA_RAM", "DP15")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        batch_bytes = batch_nbytes(ctx.artifacts.first_batch)
        workers = getattr(loader, "num_workers", 0)
        pinned = bool(getattr(loader, "pin_memory", False))  # any iterable of batches: a list has none
        usage = dataloader_host_bytes(batch_bytes, workers, getattr(loader, "prefetch_factor", None), pinned)
        available = psutil.virtual_memory().available
        fraction = usage["total_bytes"] / max(available, 1)
        findings.data.update(usage, available_bytes=available, fraction_of_available=round(fraction, 4))
        findings.data["summary"] = (
            f"{usage['batches_in_flight']} batch(es) in flight x {batch_bytes / MIB:.2f} MiB = "
            f"{usage['total_bytes'] / MIB:.1f} MiB ({100 * fraction:.1f}% of available RAM)"
        )
        knobs = ("Lower data.num_workers, data.prefetch_factor or data.batch_size; "
                 "data.pin_memory=false drops the pinned copies.")
        code_knobs = ("Lower num_workers, prefetch_factor or batch_size of the DataLoader your build_dataloaders() "
                      "returns; pin_memory=False drops the pinned copies.")
        message = (f"the DataLoader will hold ~{usage['total_bytes'] / GIB:.2f} GiB ({workers} workers x "
                   f"prefetch {usage['batches_in_flight'] // max(workers, 1)} x {batch_bytes / MIB:.1f} MiB batches"
                   f"{', pinned copies included' if pinned else ''}), {100 * fraction:.0f}% of the "
                   f"{available / GIB:.1f} GiB of available RAM")
        if fraction > RAM_ERROR_FRACTION:
            findings.error("DATA_RAM", message, knobs, "data.num_workers", code_fix=code_knobs)
        elif fraction > RAM_WARN_FRACTION:
            findings.warning("DATA_RAM", message, knobs, "data.num_workers", code_fix=code_knobs)
        shm = usage["shared_memory_bytes"]
        if shm and os.path.isdir("/dev/shm"):
            free = shutil.disk_usage("/dev/shm").free
            findings.data["shm_free_bytes"] = free
            shm_message = f"in-flight worker batches need ~{shm / MIB:.0f} MiB of /dev/shm, {free / MIB:.0f} MiB is free"
            shm_fix = ("Enlarge /dev/shm (docker --shm-size=8g or --ipc=host), or use "
                       "torch.multiprocessing.set_sharing_strategy('file_system'), or lower data.num_workers.")
            shm_code_fix = shm_fix.replace("data.num_workers", "num_workers of the DataLoader your build_dataloaders() returns")
            if shm > free:
                findings.error("DP15", shm_message + ": workers will die with 'Bus error'", shm_fix, "data.num_workers",
                               code_fix=shm_code_fix)
            elif shm > 0.5 * free:
                findings.warning("DP15", shm_message, shm_fix, "data.num_workers", code_fix=shm_code_fix)


def constant_field(batch: Any) -> tuple[tuple[int, ...], float] | None:
    """(shape, value) of the batch's largest tensor when every value of it is one number."""
    tensors = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.numel() > 1
               and leaf.layout == torch.strided]
    if not tensors:
        return None
    largest = max(tensors, key=lambda t: t.numel())
    flat = largest.detach().reshape(-1)
    if not bool((flat == flat[0]).all()):
        return None
    return tuple(largest.shape), float(flat[0])


def one_sample_axis(batch: Any) -> bool:
    """Whether every tensor field of the batch has the same first dim (its samples). A graph
    batch does not: node features have one row per node, edge_index two, the labels one per
    graph, so rows of the node features are not samples with targets."""
    sizes = {leaf.shape[0] for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() >= 1}
    return len(sizes) <= 1


def draws_each_index_once(loader: Any) -> bool:
    """Whether the loader's sampler yields every index at most once per epoch (a shuffle
    without replacement, a sequential pass, a random subset), so repeats are the data's."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is not None and getattr(batch_sampler, "sampler", None) is not sampler:
        return False  # a custom batch sampler: its own rules
    if isinstance(sampler, RandomSampler):
        return not sampler.replacement
    return isinstance(sampler, (SequentialSampler, SubsetRandomSampler))


def rich_inputs(batch: Any) -> bool:
    """Whether the batch's largest tensor holds values that do not repeat by chance: any
    non-integer value, or integer rows of FEW_DISTINCT_RICH or more values per sample."""
    tensors = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() >= 1
               and leaf.numel() > 0 and leaf.layout == torch.strided]
    if not tensors:
        return False
    largest = max(tensors, key=lambda t: t.numel())
    if largest.is_floating_point():
        values = largest.detach().float()
        return bool((values != values.round()).any())
    return largest.numel() // max(int(largest.shape[0]), 1) >= FEW_DISTINCT_RICH


def expected_distinct(size: int, draws: int) -> float:
    """Distinct values among ``draws`` uniform draws with replacement from ``range(size)``."""
    return size * -math.expm1(draws * math.log1p(-1 / size)) if size > 1 else float(min(size, draws))


def distinct_pool(distinct: int, draws: int) -> int:
    """How many equally common distinct samples give ``distinct`` of them among ``draws``
    uniform draws: the dataset's distinct samples, estimated (bisection on expected_distinct)."""
    low, high = distinct, max(distinct, 1) * 1000
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if expected_distinct(middle, draws) < distinct else (low, middle)
    return high


def reseeding_in_getitem(ctx: PreflightContext, check: str, findings: Findings) -> str | None:
    """The seeding call a map-style dataset makes with one seed both in ``dataset[0]`` and in
    ``dataset[1]`` (``np.random.default_rng(0)``), RNGs put back after; None otherwise."""
    dataset = getattr(ctx.train_loader, "dataset", None)
    if dataset is None or not is_map_style(dataset):
        return None
    guard = DataGuard(ctx, check, findings)
    per_item: list[list[str]] = []
    with preserved_data_state(ctx):
        for index in (0, 1):
            calls: list[str] = []
            with seeding_watched(calls, SEEDING + SEEDED_GENERATORS):
                try:
                    guard.call(operator.getitem, dataset, index, what=f"dataset[{index}]")
                except Exception:  # a dataset that cannot be indexed so: nothing to say
                    return None
            per_item.append(calls)
    return next((call for call in per_item[0] if call in per_item[1]), None)


class DuplicateSamplesCheck(Check):
    """DP2: an IterableDataset that is not sharded yields every sample once per worker;
    DATA_IDENTICAL: a first batch made of (nearly) one sample, whatever the dataset type."""

    @staticmethod
    def _few_distinct(ctx: PreflightContext, findings: Findings) -> None:
        """DATA_FEW_DISTINCT: the first window of a loader that draws each index once holds
        far fewer distinct samples than it read."""
        batches = ctx.artifacts.window_batches or []
        if not batches or not one_sample_axis(batches[0]) or not rich_inputs(batches[0]):
            return
        digests = [digest for batch in batches for digest in sample_hashes(batch)]
        read, distinct = len(digests), len(set(digests))
        findings.data.update(window_read=read, window_distinct=distinct)
        try:
            length = len(ctx.train_loader.sampler)
        except TypeError:
            return
        if read < FEW_DISTINCT_MIN_READ or distinct > FEW_DISTINCT_SHARE * read or length < 2 * read:
            return
        stored = getattr(getattr(ctx.train_loader, "dataset", None), "tensors", None)
        if isinstance(stored, (tuple, list)) and stored and all(isinstance(t, torch.Tensor) for t in stored):
            rows = min(len(stored[0]), 4 * read)
            stored_distinct = len(set(sample_hashes(tuple(t[:rows] for t in stored))))
            findings.data["stored_distinct"] = [stored_distinct, rows]
            if stored_distinct <= FEW_DISTINCT_SHARE * rows:
                return  # the tensors themselves repeat (a small MDP's replay buffer): data, not index arithmetic
        pool = distinct_pool(distinct, read)
        fix = ("Check the index arithmetic in the dataset's __getitem__: an index divided or reduced on the way "
               "(idx // k, idx % k, a bucket or file number used as the row), a lookup table built with too few "
               "entries, or a cache keyed by something other than the index. Print dataset[i] for a few i to "
               "compare. If the repetition is deliberate (a small dataset repeated to lengthen the epoch), disable "
               "the issue DATA_FEW_DISTINCT.")
        findings.warning(
            "DATA_FEW_DISTINCT",
            f"the first {read} samples the training loader read hold only {distinct} distinct ones (inputs and "
            f"targets compared by value), although its sampler draws each of its {length} indices once per epoch: "
            f"the dataset serves about {pool} distinct samples under {length} indices, so the model trains on ~{pool} "
            "examples however long it runs",
            fix,
            code_fix=fix,
        )

    @staticmethod
    def _identical_samples(digests: list[str], findings: Findings, inputs_only: bool = False,
                           constant: tuple[tuple[int, ...], float] | None = None,
                           reseeded: Callable[[], str | None] = lambda: None) -> None:
        """``constant``: (shape, value) of the inputs' largest field when it holds one value everywhere."""
        distinct = len(set(digests))
        if len(digests) < IDENTICAL_MIN_BATCH or distinct > IDENTICAL_MAX_DISTINCT * len(digests):
            return
        findings.data["distinct_in_first"] = distinct
        many = f"{distinct} distinct {'sample' if distinct == 1 else 'samples'}"
        if inputs_only and constant is not None:  # not one sample served again: a field built constant
            shape, value = constant
            findings.warning(
                "DATA_IDENTICAL",
                f"the first batch's largest input field {shape} holds one value ({value:g}) in every position of "
                "every sample while the targets differ: it is built constant, not from each sample. A dense "
                "adjacency or mask filled by indexing with a whole index tensor does this: A[edge_index] = 1 with "
                "a (2, E) edge_index selects whole rows of A (every node connected to every other), where "
                "A[edge_index[0], edge_index[1]] = 1 sets the edges",
                "Print that field for one sample and check how it is filled: index with one tensor per dimension "
                "(A[src, dst] = 1), and make sure it is computed from the sample's own data.",
            )
            return
        if inputs_only:  # the targets differ, the inputs do not: nothing to learn them from
            findings.warning(
                "DATA_IDENTICAL",
                f"the first batch's inputs (its largest field) hold {distinct} distinct "
                f"{'value' if distinct == 1 else 'values'} among its {len(digests)} samples while their targets "
                "differ: the dataset serves the same input under different indices (e.g. a fixed row, path or cache "
                "slot), so the model cannot tell the samples apart",
                "Check how the dataset's __getitem__ picks the input for an index: a constant index (v[0] instead "
                "of v[idx]), a file path that does not contain the index (an f-string with doubled braces), a "
                "cache that returns one entry. Print dataset[0] and dataset[1] to compare.",
            )
            return
        mask = (" Exactly two: a Subset (or an index list) given a boolean mask, Subset(data, [r == 'train' for r in "
                "rows]), whose True/False entries index samples 1 and 0, where the indices of the True entries were "
                "meant" if distinct == 2 else "")
        seeding = reseeded()
        if seeding is not None:
            findings.warning(
                "DATA_IDENTICAL",
                f"the first batch holds {many} among its {len(digests)} (inputs and targets compared by value), and "
                f"the dataset's __getitem__ calls {seeding} for dataset[0] and again for dataset[1]: a random "
                "generator re-created (or re-seeded) with the same seed for every item draws the same numbers, so "
                "every index yields the same sample and the model trains on one example",
                "Seed per item, or once: np.random.default_rng(self.seed + idx) (torch.Generator().manual_seed("
                "seed + idx)) inside __getitem__, or create the generator once in __init__ and draw from it.",
            )
            return
        fix = ("Check the index arithmetic in the dataset's __getitem__ (or the iterator of an IterableDataset): a "
               "stride or offset that rounds to 0 (e.g. int(window * 0.01)), an index that is never used, or a "
               "cached sample returned for every index" + ("; give Subset the indices, "
               "[i for i, keep in enumerate(mask) if keep] or torch.nonzero(mask).flatten().tolist()" if mask else "")
               + ". Print dataset[0] and dataset[1] to compare.")
        findings.warning(
            "DATA_IDENTICAL",
            f"the first batch holds {many} among its {len(digests)} (inputs and targets compared by value): the "
            f"dataset serves the same {'sample' if distinct == 1 else 'samples'} under different indices, so the "
            f"model trains on {distinct} {'example' if distinct == 1 else 'examples'} however long it runs.{mask}",
            fix,
            code_fix=fix,
        )

    name = "data.duplicates"
    stage = Stage.DATA
    codes = ("DP2", "DATA_IDENTICAL", "DATA_FEW_DISTINCT")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batches = ctx.artifacts.first_batches
        hashes = [sample_hashes(batch) for batch in batches]
        # Kept for the cross-rank comparison at the end of preflight.
        ctx.artifacts.sample_hashes = hashes[0] if hashes else []
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
        if hashes:
            self._identical_samples(hashes[0], findings, reseeded=lambda: reseeding_in_getitem(ctx, self.name, findings))
            if "distinct_in_first" not in findings.data and batches and one_sample_axis(batches[0]) \
                    and not _transitions(batches[0]):
                self._identical_samples(input_digests(batches[0]), findings, inputs_only=True,
                                        constant=constant_field(batches[0]))
        if "distinct_in_first" not in findings.data and draws_each_index_once(ctx.train_loader):
            self._few_distinct(ctx, findings)
        if later and repeated / later >= DUPLICATE_FRACTION:
            workers = ctx.train_loader.num_workers
            findings.error(
                "DP2",
                f"{repeated} of {later} samples in the first batches of workers 2..{len(hashes)} repeat worker 1's: "
                f"the IterableDataset is not sharded, so each of the {workers} workers yields the whole stream "
                f"(every sample is seen {workers} times per epoch)",
                SHARD_FIX,
                "data.train",
                code_fix=SHARD_FIX,  # a change to the dataset's code either way
            )




def _transitions(batch: object) -> bool:
    """A batch of (state, ..., next state, done) transitions: the states of a small environment
    repeat by design, and what follows them (rewards, next states) differs."""
    from optimus_preflight.preflight.checks.transition_flags import flag_field  # it imports this module

    return flag_field(batch) is not None
