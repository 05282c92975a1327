"""What checks leave for later checks in one preflight run, one typed field each.

A field is None (or empty) until the check that produces it has run; a check that reads
one lists its producer in ``requires``, so the runner skips it when the producer did not
pass. Types of the analyses and data access layers are named for type checkers only:
the framework imports nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optimus_preflight.checkpoint.training_snapshot import TrainingStateSnapshot
    from optimus_preflight.memory.result import MemoryEstimate
    from optimus_preflight.preflight.analyses.probe import StepProbe
    from optimus_preflight.preflight.data_access.guard import HungEarlier


@dataclass
class Artifacts:
    # data.first_batch: the real first training batch, as the loader yields it, on the CPU.
    first_batch: Any = None
    # data.first_batch: one batch per worker for an IterableDataset, to compare them.
    first_batches: list[Any] = field(default_factory=list)
    # data.first_batch: every batch it fetched (two when a micro-batch of one sample must
    # be split for accumulation).
    window_batches: list[Any] = field(default_factory=list)
    # data.duplicates: per-sample digests of the first batch, compared across ranks at the end.
    sample_hashes: list[str] = field(default_factory=list)
    # step.first_step: the observed first real step (analyses.probe.get_probe), computed once.
    step_probe: StepProbe | None = None
    # The first data call that hung (data_access.guard): every later guarded call skips.
    data_hang: HungEarlier | None = None
    # memory.vram_headroom / memory.host_ram: the step's estimate, and the largest
    # micro-batch that fits (the OOM observer's hint).
    memory_estimate: MemoryEstimate | None = None
    largest_micro_batch: int | None = None
    # The training state taken once per run (framework.runner); checks that run steps
    # restore it (framework.preserve).
    snapshot: TrainingStateSnapshot | None = None
