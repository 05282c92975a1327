"""NCAR CREDIT's ``credit.trainers.preflight`` API: names, signatures and contracts, on
CREDIT's config layout and on ours.

Each function reads the config best effort (``compat.credit_config``) and calls the
core's typed API: ``preflight.loader_startup`` (loader settings, host RAM, the first
batch) and ``memory.gpu_step`` (the synthetic GPU step). Keyword-only arguments are
this package's extensions; the seed's positional calls keep their meaning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.optim import Optimizer

from optimus_preflight.compat.credit_config import (
    config_loader_settings,
    credit_loader_settings,
    credit_sample,
    is_credit_layout,
    lm_sample_bytes,
    our_loader_settings,
    synthetic_input,
)
from optimus_preflight.config.lenient import as_int, conf_get
from optimus_preflight.config.schema import PRECISIONS
from optimus_preflight.memory.gpu_step import (
    GpuStepReport,
    check_gpu_step,
    is_fsdp,
    measure_gpu_step,
    output_mean_loss,
)
from optimus_preflight.preflight.data_access.samples import batch_nbytes
from optimus_preflight.preflight.loader_startup import (
    LoaderSettings,
    check_first_batch,
    loader_host_bytes,
    with_loader_settings,
)

log = logging.getLogger("optimus_preflight")
GIB = 1024**3
NAME = "check_model_gpu_memory"  # the prefix of its log lines, which scripts grep for

__all__ = ["estimate_dataloader_memory_gib", "check_dataloader_startup", "check_model_gpu_memory",
           "dataloader_memory_estimate", "gpu_step_report", "synthetic_input"]


# ------------------------------------------------------------------ DataLoader memory
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


def _unknown(settings: LoaderSettings, why: str) -> tuple[str, int, LoaderSettings]:
    log.debug("dataloader estimate: 0.0 (%s)", why)
    return "unknown", 0, settings


def _batch_bytes(conf: Any, batch: Any, read_sample: bool, loader: Any) -> tuple[str, int, LoaderSettings]:
    """(method, bytes of one batch, the loader settings to multiply by)."""
    if batch is not None:
        return "measured", batch_nbytes(batch), with_loader_settings(config_loader_settings(conf), loader)
    ours = our_loader_settings(conf)
    if read_sample and ours is not None:
        per_sample = _sample_bytes_from_dataset(conf)
        settings = with_loader_settings(ours, loader)
        if per_sample and settings.batch_size:
            return "sample", per_sample * settings.batch_size, settings
    credit, credit_settings = credit_sample(conf), credit_loader_settings(conf)
    if credit is not None and credit.channels and credit_settings is not None:
        settings = with_loader_settings(credit_settings, loader)
        return "credit", credit.nbytes * (settings.batch_size or 1), settings
    per_sample = lm_sample_bytes(conf)
    if per_sample and ours is not None:
        settings = with_loader_settings(ours, loader)
        if settings.batch_size:
            return "shapes", per_sample * settings.batch_size, settings
    if credit is not None and not credit.channels:
        return _unknown(with_loader_settings(credit_settings, loader), "CREDIT's data.source lists no variables")
    return _unknown(with_loader_settings(config_loader_settings(conf), loader),
                    "the config has neither CREDIT's data.source variables with trainer settings nor our "
                    "data.batch_size with data.train.block_size")


def _estimate(conf: Any, batch: Any, read_sample: bool, loader: Any) -> tuple[dict[str, Any], LoaderSettings]:
    try:
        method, nbytes, settings = _batch_bytes(conf, batch, read_sample, loader)
    except Exception as error:  # the readers never raise; a batch of odd leaves might
        log.debug("dataloader estimate: 0.0 (%s: %s)", type(error).__name__, error)
        method, nbytes, settings = "unknown", 0, with_loader_settings(None, loader)
    return {"method": method, **loader_host_bytes(nbytes, settings)}, settings


def dataloader_memory_estimate(conf: Any, batch: Any = None, *, read_sample: bool = False,
                               loader: Any = None) -> dict[str, Any]:
    """Host RAM the training DataLoader holds, in bytes, with the method used:

    - ``measured``: the bytes of ``batch`` (a real batch, any nested structure);
    - ``sample`` (only with ``read_sample=True``: instantiates ``data.train``, so IO):
      the bytes of ``data.train[0]`` times ``data.batch_size``;
    - ``credit``: CREDIT's layout, H x W x channels float32, input and target, times
      ``trainer.train_batch_size`` (see ``compat.credit_config`` for the keys and defaults);
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


# ------------------------------------------------------------------ the first batch
def check_dataloader_startup(conf: Any, loader: Any, rank: int = 0, timeout_s: float = 300.0, *,
                             all_ranks: bool = False) -> None:
    """Run pre-training data loading checks (rank-0 only).

    Seed contract (CREDIT): on a rank other than 0 it returns at once without touching
    ``loader``. On rank 0 it logs the DataLoader memory estimate and fetches the first
    batch within ``timeout_s`` seconds (``preflight.loader_startup.check_first_batch``):
    a hang raises RuntimeError naming the frame that blocks and the fix, with the loader
    settings and the config's memory estimate; an exception of the loader propagates as
    itself, its type and message unchanged, after an ERROR log with the fix; a loader
    that yields nothing raises RuntimeError; estimated memory that looks dangerous
    warns above 50% of the available host RAM and raises RuntimeError above 80%.
    ``conf`` is read best effort (``{}`` works): the memory figure is the measured first
    batch times the batches in flight, and the loader's own ``num_workers``,
    ``prefetch_factor`` and ``pin_memory`` override the config's (they are what runs).
    Messages name CREDIT's keys on CREDIT's layout and ours on ours.

    Extension: ``all_ranks=True`` runs the check on every rank (any rank's loader can
    hang), each raising for itself; only rank 0 logs the success line and warnings.
    """
    if rank != 0 and not all_ranks:
        return
    config_estimate, estimated_with = _estimate(conf, None, False, loader)
    if rank == 0 and config_estimate["total_bytes"] > 0:
        log.info("DataLoader memory estimate from the config: %.2f GiB (%s; %s)",
                 config_estimate["total_bytes"] / GIB, config_estimate["method"], estimated_with.describe())
    check_first_batch(loader, with_loader_settings(config_loader_settings(conf), loader), rank=rank,
                      timeout_s=timeout_s, config_estimate_bytes=config_estimate["total_bytes"])


# ------------------------------------------------------------------ the GPU step
def _precision(conf: Any) -> str:
    requested = conf_get(conf, "trainer.precision")
    requested = "fp32" if requested is None else str(requested)
    if requested not in PRECISIONS:  # e.g. CREDIT's configs have no trainer.precision of this form
        log.debug("%s: trainer.precision=%r is not one of %s; using fp32", NAME, requested, PRECISIONS)
        return "fp32"
    return requested


def _accumulation_steps(conf: Any) -> int:
    raw = conf_get(conf, "trainer.accumulation_steps")
    return as_int(1 if raw is None else raw, minimum=1) or 1


def gpu_step_report(conf: Any, model: nn.Module, optimizer: Optimizer, *, batch: Any,
                    loss_fn: Callable[[nn.Module, Any], Any] | None = None, scaler: Any = None,
                    meter: Any = None) -> GpuStepReport:
    """``memory.gpu_step.measure_gpu_step`` with ``trainer.precision`` and
    ``trainer.accumulation_steps`` read from ``conf`` (fp32 and 1 where absent or odd)."""
    return measure_gpu_step(model, optimizer, batch, loss_fn, precision=_precision(conf),
                            accumulation_steps=_accumulation_steps(conf), scaler=scaler, meter=meter)


def check_model_gpu_memory(
    conf: Any,
    model: nn.Module,
    optimizer: Optimizer,
    rank: int = 0,
    *,
    batch: Any = None,
    loss_fn: Callable[[nn.Module, Any], Any] | None = None,
    scaler: Any = None,
    raise_on_oom: bool = False,
) -> None:
    """Run a synthetic forward/backward/optimizer step and log peak VRAM.

    Seed contract (CREDIT): builds a zero-filled batch of the input shape the config
    implies, runs it through the model (the module inside a DDP wrapper), backpropagates,
    steps the optimizer and logs the peak VRAM (``torch.cuda.max_memory_allocated``).
    Returns None and does not raise (see ``raise_on_oom``); it skips, with one log line
    (CREDIT skips silently), when ``rank != 0`` (DEBUG), when CUDA is not available (the
    CPU-side fake-tensor prediction is logged instead, or why it failed), when the input
    shape cannot be inferred (WARNING), for an FSDP model (its step needs every rank),
    and when the synthetic pass raises (WARNING with the error).

    The input shape (``compat.credit_config.synthetic_input``): CREDIT's layout gives
    ``frames x (channels x levels + surface_channels + input_only_channels)`` values per
    grid point, built as the 5-D ``(trainer.train_batch_size, channels x levels + surface
    + input_only, frames, image_height, image_width)`` float32 tensor CREDIT's models take
    in ``forward`` (CREDIT's own preflight flattens frames into channels, a 4-D tensor
    that CrossFormer's Conv3d patch embedding cannot take; the element count, hence the
    memory, is the same), and the loss is the output's mean; ours gives
    ``(data.batch_size, block_size)`` int64 token ids with targets of the same shape and
    cross-entropy.

    Beyond the seed (``memory.gpu_step.check_gpu_step``): two steps under
    ``trainer.precision``'s autocast and ``trainer.accumulation_steps`` micro-batches, a
    fake-tensor prediction logged next to the measurement, and everything the step
    touched restored afterwards, in every case. ``batch=`` a real training batch instead
    of the zero one; ``loss_fn(model, batch)`` (default: cross-entropy over ``(inputs,
    targets)``, or the output's mean for the CREDIT zero batch); ``scaler`` the fp16
    GradScaler. A CUDA out-of-memory error is logged as an ERROR with the fix and not
    raised, unless ``raise_on_oom=True`` (then RuntimeError, after the state is
    restored): the seed's callers call it unguarded, as a diagnostic before training.
    """
    if rank != 0:
        log.debug("%s: skipped on rank %d (rank 0 reports)", NAME, rank)
        return
    if is_fsdp(model):
        log.warning("%s: skipped for an FSDP model (its step needs every rank)", NAME)
        return
    example: Any = batch
    if batch is None:
        example = synthetic_input(conf)
        if example is None:
            log.warning(
                "%s: skipped: cannot infer the input shape from the config (CREDIT's "
                "model.channels/levels/surface_channels/input_only_channels, or data.batch_size with "
                "data.train.block_size and model.vocab_size); pass batch=<first training batch>", NAME
            )
            return
        if loss_fn is None and not example.with_targets:
            loss_fn = output_mean_loss
    credit = example.layout == "credit" if batch is None else is_credit_layout(conf)
    fix = ("reduce trainer.train_batch_size, train in bf16 mixed precision or use activation checkpointing"
           if credit else None)
    check_gpu_step(model, optimizer, example, loss_fn, precision=_precision(conf),
                   accumulation_steps=_accumulation_steps(conf), scaler=scaler, raise_on_oom=raise_on_oom,
                   name=NAME, **({"oom_fix": fix} if fix else {}))
