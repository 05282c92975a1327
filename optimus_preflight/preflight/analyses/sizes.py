"""Byte counts of training state, measured from the real objects."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training.batches import tensors


def local_storage(tensor: torch.Tensor) -> torch.UntypedStorage:
    """The storage this process holds for ``tensor``: an FSDP2 DTensor's is its shard's."""
    return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).untyped_storage()


SPARSE_PARTS = {
    torch.sparse_coo: lambda t: (t._indices(), t._values()),
    torch.sparse_csr: lambda t: (t.crow_indices(), t.col_indices(), t.values()),
    torch.sparse_bsr: lambda t: (t.crow_indices(), t.col_indices(), t.values()),
    torch.sparse_csc: lambda t: (t.ccol_indices(), t.row_indices(), t.values()),
    torch.sparse_bsc: lambda t: (t.ccol_indices(), t.row_indices(), t.values()),
}


def dense_parts(value: Any):
    """The tensors of a nested structure, a sparse one as the dense tensors that hold it (its
    indices and values): a sparse tensor has no storage of its own to measure."""
    for item in tensors(value):
        parts = SPARSE_PARTS.get(item.layout)
        yield from (parts(item) if parts is not None else (item,))


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a nested structure (each storage counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for item in dense_parts(value):
        if item.device.type == "meta":
            key, size = (id(item), 0), item.numel() * item.element_size()
        else:
            storage = local_storage(item)
            key, size = (storage.data_ptr(), storage.nbytes()), storage.nbytes()
        if key not in seen:
            seen.add(key)
            total += size
    return total


def _state_bytes_per_param_byte(optimizer: Optimizer, group: dict[str, Any], param: torch.Tensor) -> float:
    """Step a copy of the optimizer's class, with this group's settings, on a small probe
    tensor of the param's dtype: the state it creates per byte of parameter is what the
    real state will be, for any element-wise optimizer (Adam: 2, SGD+momentum: 1)."""
    probe = torch.zeros(4, 4, dtype=param.dtype, device=param.device, requires_grad=True)
    settings = {key: value for key, value in group.items() if key != "params"}
    try:
        trial = type(optimizer)([{"params": [probe], **settings}])
        probe.grad = torch.full_like(probe, 1e-3)
        trial.step()
    except Exception:
        return 2.0  # an optimizer we cannot build this way: assume Adam's two moments
    state = trial.state.get(probe, {})
    moments = sum(value.numel() * value.element_size() for value in state.values() if isinstance(value, torch.Tensor) and value.numel() > 1)
    return moments / (probe.numel() * probe.element_size())


def optimizer_state_bytes(optimizer: Optimizer) -> int:
    """The optimizer state's size once every parameter has stepped: measured where the
    state exists, predicted per group from a probe step where it does not yet."""
    total = 0
    for group in optimizer.param_groups:
        ratio = None
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state:
                total += tensor_bytes(state)
                continue
            if ratio is None:
                ratio = _state_bytes_per_param_byte(optimizer, group, param)
            total += int(ratio * param.numel() * param.element_size())
    return total


def checkpoint_bytes_estimate(model: nn.Module, optimizer: Optimizer | None) -> int:
    """Model state (params and persistent buffers) plus the full optimizer state."""
    total = tensor_bytes(model.state_dict())
    if optimizer is not None:
        total += optimizer_state_bytes(optimizer)
    return total


def loader_batches_in_flight(num_workers: int, prefetch_factor: int | None) -> int:
    """Batches a DataLoader holds at once: each worker prefetches ``prefetch_factor``
    (torch's default 2); without workers, the one being handed over."""
    if num_workers <= 0:
        return 1
    return num_workers * (prefetch_factor if prefetch_factor is not None else 2)


def pins_memory(pin_memory: bool) -> bool:
    """DataLoader pins only when an accelerator is there to copy to (it warns otherwise)."""
    accelerator = getattr(torch, "accelerator", None)
    available = accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
    return bool(pin_memory) and available


def dataloader_host_bytes(batch_bytes: int, num_workers: int, prefetch_factor: int | None, pin_memory: bool) -> dict[str, int]:
    """Host RAM a DataLoader holds: in-flight batches (in /dev/shm when workers produce
    them), plus a pinned copy of each when memory is really pinned (``pins_memory``)."""
    in_flight = loader_batches_in_flight(num_workers, prefetch_factor)
    batches = in_flight * batch_bytes
    pinned = batches if pins_memory(pin_memory) else 0
    return {
        "batches_in_flight": in_flight,
        "batch_bytes": batch_bytes,
        "batches_bytes": batches,
        "shared_memory_bytes": batches if num_workers > 0 else 0,
        "pinned_bytes": pinned,
        "total_bytes": batches + pinned,
    }
