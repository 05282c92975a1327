"""The formula for one FSDP2 rank, for when the step cannot be traced.

Exact: the sharded states (each parameter's dim 0 padded to a multiple of ``world_size``,
as FSDP2 pads, then split; rank 0 holds a full shard), and the sizes of every group's
gathered parameters and reduce-scatter buffers (groups are the blocks ``find_blocks``
picks plus the root, as ``shard_model`` wraps them). Assumed (listed in ``notes``):

- the root's parameters (embeddings, final norm, head) stay gathered from its forward to
  the end of its backward (``reshard_after_forward=False`` for the root);
- in the forward, a block's gathered parameters, the next block's (prefetch) and, while
  they are copied out, its all-gather output buffer are live at once; in the backward, a
  block's gathered parameters, the prefetched previous block's, the block's unsharded
  gradients (parameter dtype) and its reduce-scatter input (reduce dtype) are;
- the optimizer step's temporaries are not counted (a foreach step adds up to one more
  copy of the sharded parameters);
- activations are not modelled: none are counted, so the peak is a lower bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch._subclasses import FakeTensorMode
from torch.optim import Optimizer

from optimus_preflight.memory import cuda_rules
from optimus_preflight.memory.analytic import EstimateError, optimizer_states_per_param
from optimus_preflight.memory.fsdp_result import FSDPMemoryEstimate
from optimus_preflight.memory.tracker import REPORT_KEYS
from optimus_preflight.training.batches import tensors

NOTES = (
    "analytic FSDP2 formula: sharded parameters, gradients and optimizer state exact (dim-0 padding included); "
    "gathered parameters: the root's throughout plus two blocks' (the running one and the prefetched one); "
    "backward adds the running block's unsharded gradients and reduce-scatter input",
    "activations are not counted: the peak is a lower bound",
)


def padded_shard_numel(shape: Sequence[int], world_size: int) -> int:
    """Elements of one rank's shard: dim 0 padded up to a multiple of ``world_size``, split."""
    if not shape:
        return 1
    return math.ceil(shape[0] / world_size) * math.prod(shape[1:])


def fsdp_analytic_estimate(
    model_fn: Callable[[], nn.Module],
    example_batch: Any,
    build_optimizer: Callable[[nn.Module], Optimizer],
    *,
    world_size: int,
    precision: str,
    device: str,
    accumulation_steps: int,
    block_classes: Sequence[str],
    activation_checkpointing: bool,
    reshard_after_forward: bool,
    reason: str,
    started: float,
) -> FSDPMemoryEstimate:
    from optimus_preflight.memory.fsdp_estimate import meta_copy
    from optimus_preflight.training.sharding import find_blocks

    size = cuda_rules.round_size if device == "cuda" else (lambda nbytes: nbytes)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = meta_copy(model_fn())
        optimizer = build_optimizer(model)
    except Exception as error:
        raise EstimateError(f"cannot estimate the FSDP step's memory: {reason}; building the model failed too "
                            f"({error})") from error
    states, known = optimizer_states_per_param(optimizer)
    compute = torch.bfloat16 if precision == "bf16" else None
    reduce_bytes = 4 if precision == "bf16" else None

    def group_sizes(params: list[nn.Parameter]) -> tuple[int, int, int]:
        """(gathered bytes, unsharded gradient bytes, reduce-scatter input bytes) of a group."""
        gathered = grads = scatter = 0
        for p in params:
            element = torch.empty((), dtype=compute or p.dtype).element_size()
            full = padded_shard_numel(p.shape, world_size) * world_size
            gathered += size(full * element)
            if p.requires_grad:
                grads += size(p.numel() * element)
                scatter += full * (reduce_bytes or element)
        return gathered, grads, size(scatter)

    blocks = find_blocks(model, block_classes)
    in_blocks = {id(p) for block in blocks for p in block.parameters()}
    params = list({id(p): p for p in model.parameters()}.values())
    root = group_sizes([p for p in params if id(p) not in in_blocks])
    per_block = [group_sizes(list(block.parameters())) for block in blocks]
    none = (0, 0, 0)
    # Forward: the running block's parameters, the next one's all-gather output and gathered copy.
    forward = max((g + 2 * n for (g, _, _), (n, _, _) in zip(per_block, per_block[1:] + [none])), default=0)
    # Backward: the running block's parameters, gradients and reduce-scatter input, the previous one prefetched.
    backward = max((g + grad + rs + p for (g, grad, rs), (p, _, _) in zip(per_block, [none] + per_block[:-1])),
                   default=root[1] + root[2])
    shard = {id(p): size(padded_shard_numel(p.shape, world_size) * p.element_size()) for p in params}
    sharded_params = sum(shard.values())
    sharded_grads = sum(shard[id(p)] for p in params if p.requires_grad)
    communication = root[0] + max(forward, backward)
    breakdown = dict.fromkeys(REPORT_KEYS, 0)
    breakdown.update(
        params=sharded_params,
        grads=sharded_grads,
        optimizer_state=states * sharded_grads,
        other=communication + sum(size(b.numel() * b.element_size()) for b in model.buffers())
        + sum(t.numel() * t.element_size() for t in tensors(example_batch)),
    )
    detail = {"gathered_params_and_buffers": communication}
    peak = sum(breakdown.values())
    notes = list(NOTES)
    if not known:
        notes.append(f"{type(optimizer).__name__} is not a torch optimizer: assumed {states} state tensors per parameter")
    if not reshard_after_forward:
        notes.append("reshard_after_forward=False is not modelled: blocks are assumed resharded after forward")
    estimate = FSDPMemoryEstimate(
        peak_bytes=peak,
        breakdown=breakdown,
        method="analytic",
        elapsed_s=time.perf_counter() - started,
        device=device,
        precision=precision,
        accumulation_steps=accumulation_steps,
        peak_at="backward of a block (assumed)",
        notes=notes,
        reason=reason,
        detail=detail,
        world_size=world_size,
        activation_checkpointing=activation_checkpointing,
    )
    if device == "cuda":
        estimate.workspace_bytes = cuda_rules.library_workspace_bytes()
        estimate.context_bytes = cuda_rules.CUDA_CONTEXT_BYTES
    return estimate
