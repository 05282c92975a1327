"""``MemoryEstimate``: what an estimate (or a measurement) of a training step's memory says."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GIB = float(1 << 30)


def gib(nbytes: float) -> str:
    """Human-readable size: GiB with two decimals, MiB below 1 GiB."""
    if abs(nbytes) >= GIB:
        return f"{nbytes / GIB:.2f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB"


@dataclass
class MemoryEstimate:
    """Peak bytes of live tensor storages over two full training steps.

    ``breakdown`` (keys ``params``, ``grads``, ``optimizer_state``, ``activations``,
    ``other``) is the composition at the peak; ``other`` holds buffers, the batch and
    the temporaries of backward and the optimizer step (split out in ``detail``).
    ``activations`` are the live tensors the forward pass allocated.

    For a CUDA target, ``peak_bytes`` uses the caching allocator's rounding;
    ``allocator_peak_bytes`` and ``reserved_bytes`` replay the allocator (whole
    unsplit blocks; segments obtained from cudaMalloc), and ``workspace_bytes`` and
    ``context_bytes`` are the allowances for library workspaces and the CUDA context,
    which are not tensor storages and so not in ``peak_bytes``.

    ``optimizer_step`` is the implementation the traced ``optimizer.step()`` took
    (``foreach``, ``for-loop``, ``fused``, ``mixed`` or ``custom``; see optimizer_paths):
    foreach's temporaries span every parameter at once, and ``detail["optimizer_temporaries"]``
    holds what they were at the peak.
    """

    peak_bytes: int
    breakdown: dict[str, int]
    method: str  # "fake" (traced on fake tensors), "analytic" (formula), "measured" (real run)
    elapsed_s: float
    device: str = "cpu"
    precision: str = "fp32"
    accumulation_steps: int = 1
    detail: dict[str, int] = field(default_factory=dict)
    peak_at: str = ""
    allocator_peak_bytes: int | None = None
    reserved_bytes: int | None = None
    workspace_bytes: int = 0
    context_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    optimizer_step: str = ""
    # Why the traced estimate failed, for method == "analytic".
    reason: str | None = None

    @classmethod
    def from_tracker(cls, tracker: Any, **fields: Any):
        """The peak a storage tracker saw, with its breakdown, detail and where it was."""
        return cls(peak_bytes=tracker.peak, breakdown=tracker.peak_breakdown(), detail=tracker.peak_detail(),
                   peak_at=tracker.peak_where, **fields)

    def add_cuda_allocator(self, allocator: Any, notes: list[str]) -> None:
        """The CUDA caching allocator's replayed peaks and the CUDA allowances."""
        from optimus_preflight.memory import cuda_rules

        self.allocator_peak_bytes = allocator.peak_allocated
        self.reserved_bytes = allocator.peak_reserved
        self.workspace_bytes = cuda_rules.library_workspace_bytes()
        self.context_bytes = cuda_rules.CUDA_CONTEXT_BYTES
        self.notes.extend(notes)

    @property
    def overhead_bytes(self) -> int:
        return self.workspace_bytes + self.context_bytes

    @property
    def required_bytes(self) -> int:
        """What must fit on the device: the peak plus workspaces and the CUDA context."""
        return max(self.peak_bytes, self.allocator_peak_bytes or 0) + self.overhead_bytes

    def describe(self, overheads: bool = True) -> str:
        parts = ", ".join(f"{key} {gib(value)}" for key, value in self.breakdown.items() if value)
        temporaries = self.detail.get("optimizer_temporaries", 0)
        if temporaries:  # inside ``other``; foreach's can be a large share of a step's peak (O11)
            parts += f" (of which {gib(temporaries)} optimizer.step temporaries)"
        where = f" at {self.peak_at}" if self.peak_at else ""
        text = f"peak {gib(self.peak_bytes)}{where}: {parts}"
        if overheads and self.overhead_bytes:
            text += f" + {gib(self.overhead_bytes)} CUDA context and workspaces"
        return text

    def to_dict(self) -> dict[str, Any]:
        payload = asdict(self)
        payload["elapsed_s"] = round(self.elapsed_s, 4)
        payload["required_bytes"] = self.required_bytes
        return payload
