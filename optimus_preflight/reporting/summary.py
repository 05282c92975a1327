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
    """SHA-256 over the state_dict tensors' bytes in name order (no numpy needed). An
    FSDP2 model's shards are gathered first (a collective: every rank calls this), so
    the hash is that of the whole model, equal to an unsharded run's."""
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensor = tensor.to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        if tensor.numel():
            digest.update(ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size()))
    return digest.hexdigest()


def peak_memory_bytes(device: torch.device) -> int:
    """summary.json's ``peak_memory_bytes`` (kept as it was): tensor memory on CUDA, the
    process's resident set on the CPU. ``memory_peaks`` names the two apart."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """The peak resident set of this process since the last ``reset_memory_peaks``."""
    # VmHWM is what clear_refs resets; ru_maxrss may keep a peak from before the reset
    # (the kernel folds an exited thread's high-water mark into it).
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    # ru_maxrss is in KiB on Linux (bytes on macOS, where there is no /proc: close enough).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_memory_peaks() -> None:
    """Start the peaks afresh: the jobs of a sweep run one after another in one process,
    and each job's summary must report its own peaks, not the largest job's so far."""
    try:
        # "5" resets the peak resident set (Linux >= 4.0); elsewhere the peak stays process-wide.
        Path("/proc/self/clear_refs").write_text("5", encoding="ascii")
    except OSError:
        pass
    # Only where CUDA is already up: initialising it here would do so in every CPU job.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(index)


def memory_peaks(device: torch.device) -> dict[str, Any]:
    """summary.json's ``memory``: the process's peak RSS (Python, libraries, data and
    tensors alike) and, apart from it, the measured peak of tensor memory where one
    exists, the figure comparable with the preflight's prediction of a training step."""
    tensor_peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return {
        "device": str(device),
        "peak_rss_bytes": peak_rss_bytes(),
        # On CUDA the allocator counts live tensor bytes: exactly what the preflight
        # predicts. On the CPU nothing counts them during training (the preflight's
        # memory.host_ram is a fake-tensor estimate, not a measurement), so: unknown.
        "peak_tensor_bytes": tensor_peak,
        "peak_tensor_source": "torch.cuda.max_memory_allocated" if tensor_peak is not None else None,
    }


def write_text_atomic(path: Path, text: str) -> None:
    """Readers never see a half-written file: write a sibling, then rename over."""
    # Unique per thread: a forced exit (a second Ctrl+C) may write while the main thread does.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not leave a half-written sibling behind
        raise


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    write_text_atomic(path, dumps(payload, indent=2) + "\n")
