"""``FSDPMemoryEstimate``: a ``MemoryEstimate`` of one rank of an FSDP2 job."""

from __future__ import annotations

from dataclasses import dataclass

from optimus_preflight.memory.result import MemoryEstimate


@dataclass
class FSDPMemoryEstimate(MemoryEstimate):
    """``peak_bytes`` is the peak of one rank (rank 0, the largest shards) of ``world_size``
    ranks sharding the model with FSDP2; ``where`` says where the trace ran
    (``in-process`` or ``forked child``; empty for the formula)."""

    strategy: str = "fsdp"
    world_size: int = 1
    activation_checkpointing: bool = False
    where: str = ""
