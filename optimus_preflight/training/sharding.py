"""FSDP2 (``torch.distributed.fsdp.fully_shard``): which modules are sharded, and how.

Each transformer block is sharded on its own, then the root, so a rank holds 1/N of
every parameter plus, while a block runs, that block's all-gathered parameters. The
block finder is shared with the memory estimator, so the per-rank estimate traces the
same wrapping training uses.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import torch
from torch import nn

from optimus_preflight.errors import UserError

log = logging.getLogger("optimus_preflight")

BLOCK_KEY = "trainer.fsdp.block_classes"


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model: nn.Module, class_names: Sequence[str] = ()) -> list[nn.Module]:
    """The modules to shard one by one (outermost first when ``class_names`` match nested
    modules, only the outermost is kept).

    With ``class_names``: every module whose class name is listed (a name with dots is
    matched against ``module.qualname``). Without: the children of the module list
    (``nn.ModuleList``/``nn.Sequential``) of two or more modules of one class that holds
    the most parameters, e.g. ``model.layers`` of a Llama or ``transformer.h`` of GPT-2.
    An empty list means the model has no repeated blocks: only the root is sharded.
    """
    if class_names:
        wanted = set(class_names)
        found: list[nn.Module] = []
        inside: set[int] = set()
        for module in model.modules():
            if id(module) in inside or module is model:
                continue
            cls = type(module)
            if cls.__name__ in wanted or f"{cls.__module__}.{cls.__qualname__}" in wanted:
                found.append(module)
                inside.update(id(sub) for sub in module.modules())
        if not found:
            present = sorted(Counter(type(m).__name__ for m in model.modules() if m is not model))
            raise UserError(
                f"{BLOCK_KEY}={list(class_names)} matches no module of {type(model).__name__}",
                key=BLOCK_KEY,
                fix=f"Name classes the model has (it has {', '.join(present[:12])}), or set {BLOCK_KEY}=[] "
                f"to shard the children of its largest list of repeated modules.",
            )
        return found
    best: list[nn.Module] = []
    best_params = 0
    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(child) for child in children}) != 1:
            continue
        params = _param_count(module)
        if params > best_params:
            best, best_params = children, params
    return best


def apply_activation_checkpointing(blocks: Sequence[nn.Module]) -> None:
    """Recompute each block's forward in backward (torch's composable ``checkpoint``:
    parameter names and state_dict keys stay those of the model)."""
    from torch.distributed._composable import checkpoint

    for block in blocks:
        checkpoint(block)


def mixed_precision_policy(precision: str):
    """bf16 parameters for compute with fp32 gradient reduction; None for fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def shard_model(
    model: nn.Module,
    device: torch.device,
    world_size: int,
    *,
    precision: str,
    block_classes: Sequence[str] = (),
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    blocks: Sequence[nn.Module] | None = None,
) -> nn.Module:
    """``fully_shard`` each block, then the root, over all ``world_size`` ranks. The
    model may be on the CPU: its shards are moved to ``device``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    blocks = find_blocks(model, block_classes) if blocks is None else blocks
    options: dict = {"mesh": mesh, "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy()}
    if (policy := mixed_precision_policy(precision)) is not None:
        options["mp_policy"] = policy
    block_name = type(blocks[0]).__name__ if blocks else "-"
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward, **options)
    # The root's parameters (embeddings, final norm, head) are needed again right after
    # the forward by the backward: keeping them gathered saves one all-gather.
    fully_shard(model, reshard_after_forward=False, **options)
    log.info("FSDP2: %d blocks of %s sharded over %d ranks, then the root", len(blocks), block_name, world_size)
    return model


def held_whole(tensor: torch.Tensor) -> bool:
    """A tensor this process holds whole and can read: not an FSDP shard (a DTensor, also as a
    parameter's data) and not a meta tensor kept for the memory verdict."""
    return not tensor.is_meta and "DTensor" not in (type(tensor).__name__, type(tensor.data).__name__)


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` (or a module inside it) was wrapped by ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())
