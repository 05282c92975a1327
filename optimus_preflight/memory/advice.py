"""What to change when a step does not fit: shared by the preflight checks and the OOM observer."""

from __future__ import annotations

import math


def memory_hints(
    breakdown: dict[str, int],
    *,
    precision: str | None = None,
    batch_size: int | None = None,
    largest_batch: int | None = None,
    accumulation_steps: int = 1,
    peak_at: str = "",
) -> list[str]:
    """Actionable fixes, most effective first, from the composition of the peak."""
    total = sum(breakdown.values()) or 1
    hints: list[str] = []
    if largest_batch is not None and batch_size and 0 < largest_batch < batch_size:
        accumulation = math.ceil(accumulation_steps * batch_size / largest_batch)
        hints.append(
            f"Set data.batch_size={largest_batch} (the largest micro-batch predicted to fit) and "
            f"trainer.accumulation_steps={accumulation} to keep about the same effective batch."
        )
    elif largest_batch == 0:
        hints.append(
            "Even a micro-batch of 1 does not fit: use a device with more memory, shard the model "
            "states (FSDP/ZeRO over more GPUs), train adapters (LoRA/QLoRA) or pick a smaller model."
        )
    if precision == "fp32":
        hints.append("Set trainer.precision=bf16: autocast halves the activations of matmuls and convolutions.")
    if breakdown.get("activations", 0) > 0.3 * total:
        hints.append(
            "Use activation checkpointing (torch.utils.checkpoint around the model's blocks): "
            "activations are the largest share of the peak."
        )
    if "optimizer.step" in peak_at and breakdown.get("other", 0) > 0.15 * total:
        hints.append(
            "The peak is inside optimizer.step: pass foreach=False to the optimizer for the low-memory "
            "per-tensor path (the foreach default allocates temporaries for all parameters at once; O11)."
        )
    if breakdown.get("optimizer_state", 0) > 0.4 * total:
        hints.append(
            "Optimizer state dominates: shard it (ZeRO/FSDP), or use an optimizer with less state "
            "(SGD with momentum keeps one tensor per parameter, AdamW two)."
        )
    return hints
