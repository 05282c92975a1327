"""Device and precision: the one place that knows which exist, which the machine can
run and what they mean (the autocast dtype, the GradScaler). The config's
``trainer.device`` and ``trainer.precision`` are validated here (``resolve_*``: a
UserError naming the key), and so are the memory estimator's arguments (``autocast_dtype``,
``device_type``: ValueError, as for any function argument)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import ContextManager

import torch

from optimus_preflight.config.schema import DEVICES, PRECISIONS, GradScalerConfig
from optimus_preflight.errors import UserError

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Devices a memory estimate can target (the config's trainer.device also has "auto").
TARGET_DEVICES = ("cpu", "cuda")


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision (fp32: None)."""
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"precision must be one of {', '.join(AUTOCAST_DTYPES)}, got {precision!r}")
    return AUTOCAST_DTYPES[precision]


def device_type(device: str | torch.device) -> str:
    """"cpu" or "cuda" for a device or its name ("cuda:1" too)."""
    kind = torch.device(device).type if not isinstance(device, str) or ":" in device else device
    if kind not in TARGET_DEVICES:
        raise ValueError(f"device must be one of {', '.join(TARGET_DEVICES)}, got {device!r}")
    return kind


def resolve_device(requested: str) -> torch.device:
    if requested not in DEVICES:
        raise UserError(
            f"trainer.device must be one of {', '.join(DEVICES)}, got {requested!r}",
            key="trainer.device",
            fix="Set trainer.device=auto to use a GPU when there is one.",
        )
    if requested == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "trainer.device=cuda but torch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None})",
            key="trainer.device",
            fix="Set trainer.device=cpu, or install a CUDA build of torch on a GPU machine.",
        )
    if requested == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    # Under torchrun each process drives the GPU of its local rank.
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def device_supports_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    # bf16 autocast runs on any CPU, but is only fast where oneDNN has native bf16.
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(requested: str, device: torch.device) -> str:
    """Return fp32, bf16 or fp16 for the device; refuse impossible combinations."""
    if requested not in PRECISIONS:
        raise UserError(
            f"trainer.precision must be one of {', '.join(PRECISIONS)}, got {requested!r}",
            key="trainer.precision",
            fix="Set trainer.precision=auto to pick the fastest safe precision for the device.",
        )
    if requested == "auto":
        # Mixed precision changes a model's numerics; auto takes it only where it is a
        # clear win with nothing to tune: bf16 on a GPU that runs it natively. fp16 needs
        # a GradScaler and a CPU's bf16 is rarely faster for small models: both opt-in.
        return "bf16" if device.type == "cuda" and device_supports_bf16(device) else "fp32"
    if requested == "bf16" and device.type == "cuda" and not device_supports_bf16(device):
        name = torch.cuda.get_device_name(device)
        raise UserError(
            f"trainer.precision=bf16 but {name} has no native bf16 support",
            key="trainer.precision",
            fix="Set trainer.precision=fp16 (mixed precision with a GradScaler) or auto.",
        )
    return requested


@dataclass(frozen=True)
class PrecisionPlan:
    precision: str
    device: torch.device

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return autocast_dtype(self.precision)

    @property
    def uses_grad_scaler(self) -> bool:
        return self.precision == "fp16"

    def autocast(self) -> ContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


def make_grad_scaler(plan: PrecisionPlan, cfg: GradScalerConfig) -> torch.amp.GradScaler:
    """A scaler that is a no-op unless the plan is fp16; its state is checkpointed either way."""
    return torch.amp.GradScaler(
        plan.device.type,
        init_scale=cfg.init_scale,
        growth_factor=cfg.growth_factor,
        backoff_factor=cfg.backoff_factor,
        growth_interval=cfg.growth_interval,
        enabled=plan.uses_grad_scaler,
    )
