"""summary.json: what a finished (or stopped) run reports, and the weights' fingerprint."""

from __future__ import annotations

import ctypes
import hashlib
import os
import resource
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from optimus_preflight.reporting.json_records import dumps

STATUSES = ("completed", "interrupted", "failed", "preflight_failed")


def params_sha256(model: nn.Module) -> str:
    """SHA-256 over the state_dict tensors' bytes in name order (no numpy needed)."""
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        if tensor.numel():
            digest.update(ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size()))
    return digest.hexdigest()


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux: the peak resident set of this process.
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Readers never see a half-written file: write a sibling, then rename over."""
    # Unique per thread: a forced exit (a second Ctrl+C) may write while the main thread does.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(dumps(payload, indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not leave a half-written sibling behind
        raise
