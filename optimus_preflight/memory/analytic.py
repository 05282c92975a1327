"""The formula fallback for when a step cannot be traced on fake tensors.

Model states are exact (the model is built on the meta device, the optimizer's state
per parameter is known for torch's optimizers); activations are what the partial trace
saw before it failed, so the result is a lower bound when the failure came early.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.memory import cuda_rules
from optimus_preflight.memory.result import MemoryEstimate
from optimus_preflight.memory.tracker import REPORT_KEYS, StorageTracker
from optimus_preflight.training.batches import tensors

# Parameter-sized state tensors each torch optimizer keeps (scalars such as `step` aside).
STATES_PER_PARAM: dict[str, Callable[[dict[str, Any]], int]] = {
    "Adam": lambda d: 2 + bool(d.get("amsgrad")),
    "AdamW": lambda d: 2 + bool(d.get("amsgrad")),
    "Adamax": lambda d: 2,
    "NAdam": lambda d: 2,
    "RAdam": lambda d: 2,
    "Adadelta": lambda d: 2,
    "Adagrad": lambda d: 1,
    "ASGD": lambda d: 1,
    "Rprop": lambda d: 2,
    "RMSprop": lambda d: 1 + bool(d.get("momentum")) + bool(d.get("centered")),
    "SGD": lambda d: int(bool(d.get("momentum"))),
    "SparseAdam": lambda d: 2,
}
UNKNOWN_OPTIMIZER_STATES = 2


class EstimateError(RuntimeError):
    """Neither the traced step nor the formula could be evaluated."""


def optimizer_states_per_param(optimizer: Optimizer) -> tuple[int, bool]:
    """(parameter-sized state tensors per parameter, whether the optimizer is known)."""
    for cls in type(optimizer).__mro__:
        rule = STATES_PER_PARAM.get(cls.__name__)
        if rule is not None and cls.__module__.startswith("torch.optim"):
            return rule(optimizer.defaults), True
    return UNKNOWN_OPTIMIZER_STATES, False


def _tensor_bytes(value: Any) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors(value))


def analytic_estimate(
    model_fn: Callable[[], nn.Module],
    example_batch: Any,
    build_optimizer: Callable[[nn.Module], Optimizer],
    *,
    precision: str,
    device: str,
    accumulation_steps: int,
    partial: StorageTracker | None,
    reason: str,
    started: float,
    model: nn.Module | None = None,
    optimizer: Optimizer | None = None,
) -> MemoryEstimate:
    """``model``/``optimizer``: the (fake) ones the failed trace built, if it got that far;
    otherwise they are built on the meta device."""
    size = cuda_rules.round_size if device == "cuda" else (lambda nbytes: nbytes)
    if model is None or optimizer is None:
        try:
            with torch.device("meta"):
                model = model_fn()
            optimizer = build_optimizer(model)
        except Exception as error:
            raise EstimateError(
                f"cannot estimate the step's memory: {reason}; building on the meta device failed too ({error})"
            ) from error
    params = list({id(p): p for p in model.parameters()}.values())
    trainable = [p for p in params if p.requires_grad]
    states, known = optimizer_states_per_param(optimizer)
    param_bytes = sum(size(p.numel() * p.element_size()) for p in params)
    grad_bytes = sum(size(p.numel() * p.element_size()) for p in trainable)
    buffer_bytes = sum(size(b.numel() * b.element_size()) for b in model.buffers())
    activations = partial.peak_totals.get("activations", 0) if partial is not None else 0
    breakdown = dict.fromkeys(REPORT_KEYS, 0)
    breakdown.update(
        params=param_bytes,
        grads=grad_bytes,
        optimizer_state=states * grad_bytes,
        activations=activations,
        other=buffer_bytes + _tensor_bytes(example_batch),
    )
    notes = [
        "analytic: parameters, gradients and optimizer state are exact sums; activations are "
        "those the trace saw before it failed, so the peak is a lower bound"
    ]
    if not known:
        notes.append(
            f"{type(optimizer).__name__} is not a torch optimizer: assumed {states} state tensors per parameter"
        )
    estimate = MemoryEstimate(
        peak_bytes=sum(breakdown.values()),
        breakdown=breakdown,
        method="analytic",
        elapsed_s=time.perf_counter() - started,
        device=device,
        precision=precision,
        accumulation_steps=accumulation_steps,
        peak_at="end of backward (assumed)",
        notes=notes,
        reason=reason,
    )
    if device == "cuda":
        estimate.workspace_bytes = cuda_rules.library_workspace_bytes()
        estimate.context_bytes = cuda_rules.CUDA_CONTEXT_BYTES
    return estimate
