"""The fix for a first step that fails only because the model is on an accelerator.

On the CPU every tensor shares one device, so code that creates a tensor without
``device=`` or passes ``pack_padded_sequence`` its lengths as part of the batch runs; on
CUDA the same step raises. The error names the op, not the line's mistake: these fixes do.
"""

from __future__ import annotations

import torch

PACKED_LENGTHS = "'lengths' argument should be a 1D CPU int64 tensor"
# torch words it by op: "Expected all tensors to be on the same device, but got index is on cpu",
# "expected self and mask to be on the same device" (masked_fill), "found at least two devices"
MIXED_DEVICES = ("to be on the same device", "found at least two devices")


def device_error_fix(error: str, device: torch.device, frame: str | None) -> str | None:
    """A fix for a device mismatch in ``error`` (the step's exception text), else None."""
    at = f" at {frame}" if frame else ""
    if PACKED_LENGTHS in error:
        return (f"pack_padded_sequence takes its lengths on the CPU, and every tensor of the batch reaches the model "
                f"on {device} (the training step moves the whole batch, as Lightning and the Hugging Face Trainer "
                f"do): pass lengths.cpu(){at}.")
    if any(text in error for text in MIXED_DEVICES) and device.type != "cpu":
        return (f"A tensor{at} is not on the model's device ({device}): one created without device= "
                "(torch.eye(n), torch.arange(T), torch.zeros(...)) or kept as a plain attribute, which model.to() "
                "does not move. Create it with device=x.device (or torch.zeros_like(x)), or register it with "
                "self.register_buffer(name, tensor) so it moves with the model.")
    return None
