"""How the model is placed on the ranks: one process, DDP (replicated) or FSDP2 (sharded).

``place_model`` is the one place that moves, wraps and shards the built model, in the
order torch requires: activation checkpointing per block, then ``fully_shard`` per block
and the root (or ``.to(device)`` and DDP). The optimizer is built afterwards, on the
parameters training will update (FSDP2's are sharded DTensors).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psutil
import torch
from torch import nn

from optimus_preflight.config.schema import TrainerConfig
from optimus_preflight.errors import UserError
from optimus_preflight.training.distributed import wrap_model
from optimus_preflight.training.sharding import apply_activation_checkpointing, find_blocks, shard_model
from optimus_preflight.training.training_context import TrainingContext

log = logging.getLogger("optimus_preflight")

# Parameters, gradients and AdamW's two moments, in fp32: the least a replicated step needs.
STATE_BYTES_PER_PARAM = 16
# auto shards when those states alone would take more than this share of one device.
AUTO_SHARE = 0.5


def device_bytes_per_rank(device: torch.device, local_world_size: int) -> int:
    """The memory one rank may use: its GPU, or its share of host RAM on CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return psutil.virtual_memory().total // max(local_world_size, 1)


def resolve_strategy(trainer: TrainerConfig, context: TrainingContext, model: nn.Module) -> str:
    """``single`` (one process), ``ddp`` or ``fsdp``. ``auto`` shards when the
    parameters, gradients and AdamW state of a replica (16 bytes per parameter, a lower
    bound of the step's need) would fill more than half of one rank's device."""
    if not context.dist.is_distributed:
        if trainer.strategy == "fsdp":
            log.info("trainer.strategy=fsdp with one process: the model is not sharded (launch with torchrun to shard it)")
        return "single"
    if trainer.strategy != "auto":
        return trainer.strategy
    params = sum(p.numel() for p in model.parameters())
    local = int(torch.cuda.device_count() or 1) if context.device.type == "cuda" else context.dist.local_world_size
    chosen, reason = auto_strategy(params, device_bytes_per_rank(context.device, local))
    log.info("trainer.strategy=auto: %s (%s)", chosen, reason)
    return chosen


def auto_strategy(params: int, device_bytes: int) -> tuple[str, str]:
    """What ``trainer.strategy=auto`` picks for ``params`` parameters on ranks of
    ``device_bytes`` each, and why: one rule for training and the preflight's memory verdict."""
    need = STATE_BYTES_PER_PARAM * params
    chosen = "fsdp" if need > AUTO_SHARE * device_bytes else "ddp"
    return chosen, (f"a replica's parameters, gradients and optimizer state take {need / 2**30:.1f} GiB "
                    f"({STATE_BYTES_PER_PARAM} bytes per parameter), {'more' if chosen == 'fsdp' else 'not more'} "
                    f"than {AUTO_SHARE:.0%} of {device_bytes / 2**30:.1f} GiB per rank")


# A verdict-only run materializes the model when its parameters take at most this share
# of the available host RAM; larger, it stays on the meta device.
HOST_SHARE = 0.5


def verdict_only(cfg) -> bool:
    """``preflight.only=true`` with ``preflight.memory.world_size``: a per-rank memory
    verdict for a model that may be far larger than this machine."""
    return bool(cfg.preflight.only and cfg.preflight.memory.world_size is not None)


def build_for_verdict(build: Callable[[], nn.Module]) -> nn.Module:
    """The model on the meta device (no memory) when its parameters would not fit this
    machine's RAM, else built for real; a meta model gets the memory verdict and the
    checks that need no weights."""
    with torch.device("meta"):
        shape_only = build()
    size = sum(p.numel() * p.element_size() for p in shape_only.parameters())
    available = psutil.virtual_memory().available
    if size <= HOST_SHARE * available:
        return build()
    log.warning("the model's parameters take %.1f GiB, more than half of this machine's %.1f GiB of available RAM: "
                "it stays on the meta device, and the preflight gives the memory verdict per rank "
                "(preflight.memory.world_size) and skips the checks that need real weights", size / 2**30, available / 2**30)
    return shape_only


def place_model(model: nn.Module, trainer: TrainerConfig, context: TrainingContext) -> tuple[nn.Module, str]:
    """The model as training will call it, and the strategy that placed it."""
    if any(param.is_meta for param in model.parameters()):
        return model, "single"  # a verdict-only run's model: nothing to move
    strategy = resolve_strategy(trainer, context, model)
    blocks = None
    if trainer.activation_checkpointing or strategy == "fsdp":
        blocks = find_blocks(model, list(trainer.fsdp.block_classes))
    if trainer.activation_checkpointing:
        if not blocks:
            raise UserError(
                f"trainer.activation_checkpointing=true, but {type(model).__name__} has no list of repeated blocks to checkpoint",
                key="trainer.fsdp.block_classes",
                fix="Name the block class(es) to recompute, e.g. trainer.fsdp.block_classes=[Block], "
                "or set trainer.activation_checkpointing=false.",
            )
        apply_activation_checkpointing(blocks)
    if strategy == "fsdp":
        if context.precision == "fp16":
            raise UserError(
                "trainer.precision resolves to fp16, which trainer.strategy=fsdp does not support "
                "(a GradScaler cannot agree on overflow across shards)",
                key="trainer.precision",
                fix="Set trainer.precision=bf16 (or fp32) with FSDP, or trainer.strategy=ddp for fp16.",
            )
        if trainer.fsdp.cpu_offload and context.device.type != "cuda":
            log.info("trainer.fsdp.cpu_offload=true on a CPU device changes nothing: the shards are in host memory already")
        offload = trainer.fsdp.cpu_offload and context.device.type == "cuda"
        sharded = shard_model(model, context.device, context.dist.world_size, precision=context.precision,
                              reshard_after_forward=trainer.fsdp.reshard_after_forward, cpu_offload=offload,
                              blocks=blocks)
        return sharded, strategy
    model = model.to(context.device)
    if strategy == "ddp":
        return wrap_model(model, context.device, trainer.ddp_find_unused_parameters), strategy
    return model, strategy
