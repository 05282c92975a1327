"""The seed API (names and roles of CREDIT's ``credit.trainers.preflight``), on our config.

``check_model_gpu_memory`` is provided by the memory estimation package.
"""

from __future__ import annotations

import logging
from typing import Any

import psutil
from omegaconf import DictConfig, OmegaConf

from optimus_preflight.preflight.checks.data_checks import RAM_ERROR_FRACTION, RAM_WARN_FRACTION
from optimus_preflight.preflight.guard import fetch_first_batch
from optimus_preflight.preflight.samples import batch_nbytes
from optimus_preflight.preflight.sizes import dataloader_host_bytes

log = logging.getLogger("optimus_preflight")
GIB = 1024**3
TOKEN_BYTES = 8  # int64 token ids


def _config(conf: Any) -> DictConfig:
    return conf if isinstance(conf, DictConfig) else OmegaConf.create(conf)


def _sample_bytes_from_dataset(data: DictConfig) -> int | None:
    """Bytes of one real sample of ``data.train`` (instantiated from its ``_target_``)."""
    from optimus_preflight.config.instantiate import instantiate_node

    if data.get("train") is None:
        return None
    try:
        dataset = instantiate_node(data.train, "data.train")
        sample = dataset[0] if hasattr(dataset, "__getitem__") else next(iter(dataset))
    except Exception as error:  # best effort, as CREDIT's estimate: fall back to shapes
        log.debug("dataloader estimate: cannot read a sample of data.train (%s)", error)
        return None
    return batch_nbytes(sample)


def _sample_bytes_from_shapes(data: DictConfig) -> int | None:
    """Sequence datasets: inputs and targets of ``block_size`` int64 tokens each."""
    block = OmegaConf.select(data, "train.block_size", default=None)
    return 2 * int(block) * TOKEN_BYTES if block else None


def dataloader_memory_estimate(conf: Any, batch: Any = None) -> dict[str, Any]:
    """Host RAM the training DataLoader holds, with the method used:

    - ``measured``: the bytes of ``batch`` (the real first batch, any nested structure);
    - ``sample``: the bytes of ``data.train[0]`` times ``data.batch_size``;
    - ``shapes``: 2 x ``data.train.block_size`` int64 tokens times ``data.batch_size``;
    - ``unknown``: none of these was available (0 bytes).
    Then: batches in flight (``num_workers`` x ``prefetch_factor``, or 1 without workers)
    x batch bytes, plus as much again in pinned copies when ``pin_memory`` is on.
    """
    data = _config(conf).data
    if batch is not None:
        method, batch_bytes = "measured", batch_nbytes(batch)
    else:
        method, batch_bytes = "unknown", 0
        for name, reader in (("sample", _sample_bytes_from_dataset), ("shapes", _sample_bytes_from_shapes)):
            per_sample = reader(data)
            if per_sample:
                method, batch_bytes = name, per_sample * int(data.batch_size)
                break
    usage = dataloader_host_bytes(batch_bytes, int(data.num_workers), data.get("prefetch_factor"), bool(data.pin_memory))
    return {"method": method, **usage}


def estimate_dataloader_memory_gib(conf: Any, batch: Any = None) -> float:
    """Estimated peak host RAM held by the training DataLoader, in GiB (see
    ``dataloader_memory_estimate`` for what it is computed from)."""
    return dataloader_memory_estimate(conf, batch)["total_bytes"] / GIB


def check_dataloader_startup(conf: Any, loader: Any, rank: int = 0, timeout_s: float = 300.0) -> None:
    """Fetch one batch from ``loader`` within ``timeout_s`` and check its memory footprint.

    Runs on every rank (any rank can hang); logs from rank 0. Raises RuntimeError with
    the hanging frame and the fixes if the batch does not arrive, if fetching raises,
    or if the loader would hold more than 80% of the available host RAM.
    """
    result = fetch_first_batch(loader, timeout_s, rank)  # iter(loader) included: a blocking __iter__ is a hang too
    estimate = dataloader_memory_estimate(conf, result.batches[0])
    available = psutil.virtual_memory().available
    fraction = estimate["total_bytes"] / max(available, 1)
    if rank == 0:
        log.info("first batch in %.2f s; the DataLoader holds ~%.3f GiB (%.1f%% of available RAM)",
                 result.latency_s, estimate["total_bytes"] / GIB, 100 * fraction)
    knobs = "lower data.num_workers, data.prefetch_factor or data.batch_size, or set data.pin_memory=false"
    if fraction > RAM_ERROR_FRACTION:
        raise RuntimeError(f"rank {rank}: the DataLoader would hold {100 * fraction:.0f}% of the available host RAM. "
                           f"Fix: {knobs}.")
    if fraction > RAM_WARN_FRACTION and rank == 0:
        log.warning("the DataLoader would hold %.0f%% of the available host RAM; %s", 100 * fraction, knobs)
