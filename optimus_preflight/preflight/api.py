"""The seed API (names, signatures and contracts of CREDIT's ``credit.trainers.preflight``),
on CREDIT's config layout and on ours.

``check_model_gpu_memory`` is provided by the memory estimation package. What is read
from a config, and how a missing or odd key is treated, is in ``config.seed_layouts``.
"""

from __future__ import annotations

import logging
from typing import Any

import psutil

from optimus_preflight.config.seed_layouts import (
    LoaderKnobs,
    conf_get,
    config_loader_knobs,
    credit_loader_knobs,
    credit_sample,
    lm_sample_bytes,
    our_loader_knobs,
    with_loader_settings,
)
from optimus_preflight.preflight.analyses.sizes import dataloader_host_bytes
from optimus_preflight.preflight.checks.data_checks import RAM_ERROR_FRACTION, RAM_WARN_FRACTION
from optimus_preflight.preflight.data_access.fetch import fetch_batches
from optimus_preflight.preflight.data_access.guard import describe_hang
from optimus_preflight.preflight.data_access.samples import batch_nbytes

log = logging.getLogger("optimus_preflight")
GIB = 1024**3


def _sample_bytes_from_dataset(conf: Any) -> int | None:
    """Bytes of one real sample of ``data.train`` (instantiated from its ``_target_``): IO."""
    from optimus_preflight.config.instantiate import instantiate_node

    node = conf_get(conf, "data.train")
    if node is None:
        return None
    try:
        dataset = instantiate_node(node, "data.train")
        sample = dataset[0] if hasattr(dataset, "__getitem__") else next(iter(dataset))
    except Exception as error:  # best effort: the config's shapes are the fallback
        log.debug("dataloader estimate: cannot read a sample of data.train (%s)", error)
        return None
    return batch_nbytes(sample)


def _unknown(knobs: LoaderKnobs, why: str) -> tuple[str, int, LoaderKnobs]:
    log.debug("dataloader estimate: 0.0 (%s)", why)
    return "unknown", 0, knobs


def _batch_bytes(conf: Any, batch: Any, read_sample: bool, loader: Any) -> tuple[str, int, LoaderKnobs]:
    """(method, bytes of one batch, the loader settings to multiply by)."""
    if batch is not None:
        knobs = with_loader_settings(config_loader_knobs(conf), loader)
        return "measured", batch_nbytes(batch), knobs
    ours = our_loader_knobs(conf)
    if read_sample and ours is not None:
        per_sample = _sample_bytes_from_dataset(conf)
        knobs = with_loader_settings(ours, loader)
        if per_sample and knobs.batch_size:
            return "sample", per_sample * knobs.batch_size, knobs
    credit, credit_knobs = credit_sample(conf), credit_loader_knobs(conf)
    if credit is not None and credit.channels and credit_knobs is not None:
        knobs = with_loader_settings(credit_knobs, loader)
        return "credit", credit.nbytes * (knobs.batch_size or 1), knobs
    per_sample = lm_sample_bytes(conf)
    if per_sample and ours is not None:
        knobs = with_loader_settings(ours, loader)
        if knobs.batch_size:
            return "shapes", per_sample * knobs.batch_size, knobs
    if credit is not None and not credit.channels:
        return _unknown(with_loader_settings(credit_knobs, loader), "CREDIT's data.source lists no variables")
    return _unknown(with_loader_settings(config_loader_knobs(conf), loader),
                    "the config has neither CREDIT's data.source variables with trainer settings nor our "
                    "data.batch_size with data.train.block_size")


def _estimate(conf: Any, batch: Any, read_sample: bool, loader: Any) -> tuple[dict[str, Any], LoaderKnobs]:
    try:
        method, batch_bytes, knobs = _batch_bytes(conf, batch, read_sample, loader)
    except Exception as error:  # the readers never raise; a batch of odd leaves might
        log.debug("dataloader estimate: 0.0 (%s: %s)", type(error).__name__, error)
        method, batch_bytes, knobs = "unknown", 0, with_loader_settings(None, loader)
    usage = dataloader_host_bytes(batch_bytes, knobs.num_workers, knobs.prefetch_factor, knobs.pin_memory)
    return {"method": method, **usage}, knobs


def dataloader_memory_estimate(conf: Any, batch: Any = None, *, read_sample: bool = False,
                               loader: Any = None) -> dict[str, Any]:
    """Host RAM the training DataLoader holds, in bytes, with the method used:

    - ``measured``: the bytes of ``batch`` (a real batch, any nested structure);
    - ``sample`` (only with ``read_sample=True``: instantiates ``data.train``, so IO):
      the bytes of ``data.train[0]`` times ``data.batch_size``;
    - ``credit``: CREDIT's layout, H x W x channels float32, input and target, times
      ``trainer.train_batch_size`` (see ``config.seed_layouts`` for the keys and defaults);
    - ``shapes``: ours, 2 x ``data.train.block_size`` int64 tokens times ``data.batch_size``;
    - ``unknown``: none of these was available (0 bytes; the reason is logged at DEBUG).

    Then: batches in flight (workers x prefetch_factor, or 1 without workers) x batch
    bytes, plus as much again in pinned copies when memory is really pinned. The
    settings come from the config (ours, else CREDIT's), overridden by ``loader``'s own
    ``num_workers``, ``prefetch_factor``, ``pin_memory`` and ``batch_size`` when given.
    Never raises.
    """
    return _estimate(conf, batch, read_sample, loader)[0]


def estimate_dataloader_memory_gib(conf: Any, batch: Any = None, *, read_sample: bool = False,
                                   loader: Any = None) -> float:
    """Estimate peak CPU RAM used by the DataLoader (GiB).

    Seed contract (CREDIT): a pure function of the config, no IO; best effort, so it
    returns 0.0 when the config lacks the keys it needs, and never raises (a missing
    key, a key of the wrong type, ``{}``, a config that is not a mapping).
    CREDIT's formula, on CREDIT's layout: ``workers x prefetch_factor x batch_size x
    sample_bytes`` with ``sample_bytes = H x W x total_channels x 4`` (float32), input
    and target counted separately (x2), ``total_channels = vars_3D x levels + vars_2D +
    diagnostic vars_2D`` of the first ``data.source``. Absent trainer keys and image
    size take CREDIT's defaults (4 workers, prefetch 4, batch 1, 721 x 1440); zero
    channels gives 0.0, as CREDIT. One deviation: with 0 workers it counts the one
    batch the main process holds, where CREDIT's product would say 0 (read as "unknown").
    On our layout: ``data.train.block_size`` int64 inputs and targets x ``data.batch_size``,
    with ``data.num_workers``, ``data.prefetch_factor`` and ``data.pin_memory``.

    Extensions (keyword arguments; the default call stays pure): ``batch=`` a real
    batch, measured; ``read_sample=True`` reads ``data.train[0]`` (instantiates the
    dataset); ``loader=`` a DataLoader whose own settings win. Details in
    ``dataloader_memory_estimate``.
    """
    return dataloader_memory_estimate(conf, batch, read_sample=read_sample, loader=loader)["total_bytes"] / GIB


def _available_ram_bytes() -> int:
    return int(psutil.virtual_memory().available)


def _hang_error(result_hang: Any, knobs: LoaderKnobs, rank: int, config_estimate: dict[str, Any],
                available: int) -> RuntimeError:
    report = describe_hang(result_hang, knobs.num_workers)
    fix = report.fix
    if knobs.layout == "credit":  # name the key this config really has
        fix = fix.replace("data.num_workers", "trainer.thread_workers")
    lines = [f"rank {rank}: {report.message}", f"Fix: {fix}", f"Loader settings: {knobs.describe()}."]
    if config_estimate["total_bytes"] > 0 and available > 0:
        lines.append(f"Estimated DataLoader RAM from the config: {config_estimate['total_bytes'] / GIB:.1f} GiB "
                     f"({100 * config_estimate['total_bytes'] / available:.0f}% of {available / GIB:.1f} GiB "
                     f"available); if it is high, {knobs.fix()}.")
    return RuntimeError("\n".join(lines))


def check_dataloader_startup(conf: Any, loader: Any, rank: int = 0, timeout_s: float = 300.0, *,
                             all_ranks: bool = False) -> None:
    """Run pre-training data loading checks (rank-0 only).

    Seed contract (CREDIT): on a rank other than 0 it returns at once without touching
    ``loader``. On rank 0 it logs the DataLoader memory estimate and fetches the first
    batch within ``timeout_s`` seconds:
    - a hang raises RuntimeError naming the frame that blocks (in this process or in a
      worker, whose stacks are dumped) and the fix, with the loader settings and the
      config's memory estimate;
    - an exception of the loader (its ``__iter__``, a ``__getitem__``, a collate_fn;
      from a worker, as DataLoader re-raises it in this process) propagates as itself,
      its type and message unchanged, after an ERROR log with the fix;
    - a loader that yields nothing raises RuntimeError;
    - estimated memory that looks dangerous: a warning above 50% of the available host
      RAM, RuntimeError above 80%.
    ``conf`` is read best effort (``{}`` works): the memory figure is the measured first
    batch times the batches in flight, and the loader's own ``num_workers``,
    ``prefetch_factor`` and ``pin_memory`` override the config's (they are what runs).

    Extension: ``all_ranks=True`` runs the check on every rank (any rank's loader can
    hang), each raising for itself; only rank 0 logs the success line and warnings.
    """
    if rank != 0 and not all_ranks:
        return
    config_estimate, knobs = _estimate(conf, None, False, loader)
    available = _available_ram_bytes()
    if rank == 0 and config_estimate["total_bytes"] > 0:
        log.info("DataLoader memory estimate from the config: %.2f GiB (%s; %s)",
                 config_estimate["total_bytes"] / GIB, config_estimate["method"], knobs.describe())
    result = fetch_batches(loader, 1, timeout_s)  # iter(loader) included: a blocking __iter__ is a hang too
    if result.hang is not None:
        raise _hang_error(result.hang, knobs, rank, config_estimate, available)
    if result.error is not None:
        fix = ("run with num_workers=0 for the traceback in one process, and fix the dataset or collate_fn"
               if knobs.num_workers else "fix the dataset or collate_fn where the traceback points")
        log.error("rank %d: fetching the first batch raised %s. Fix: %s.", rank, result.error_text, fix)
        raise result.error  # itself: callers catch the dataset's own exception types
    if not result.batches:
        raise RuntimeError(f"rank {rank}: the DataLoader yields no batches. Fix: check the dataset is not empty.")
    estimate, knobs = _estimate(conf, result.batches[0], False, loader)
    fraction = estimate["total_bytes"] / max(available, 1)
    if rank == 0:
        log.info("first batch in %.2f s; the DataLoader holds ~%.3f GiB (%.1f%% of available RAM; %s)",
                 result.latency_s or 0.0, estimate["total_bytes"] / GIB, 100 * fraction, knobs.describe())
    if fraction > RAM_ERROR_FRACTION:
        raise RuntimeError(f"rank {rank}: the DataLoader would hold {estimate['total_bytes'] / GIB:.1f} GiB, "
                           f"{100 * fraction:.0f}% of the {available / GIB:.1f} GiB of available host RAM "
                           f"({knobs.describe()}). Fix: {knobs.fix()}.")
    if fraction > RAM_WARN_FRACTION and rank == 0:
        log.warning("the DataLoader would hold %.0f%% of the available host RAM (%s); %s",
                    100 * fraction, knobs.describe(), knobs.fix())
