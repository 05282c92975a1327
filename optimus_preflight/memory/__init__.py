"""Memory preflight: predict a training step's peak memory without a GPU, check it, observe OOMs.

- Parameter counts: ``meta_param_count`` (built on the meta device), ``shape_param_count``
  (a closed-form fallback), ``base_model_param_count`` (the first that answers, labelled),
  and ``bytes_per_weight`` by training mode.
- ``estimate_step_memory``: two real training steps traced on fake tensors.
- The preflight checks built on it live in ``optimus_preflight.preflight.checks.memory_checks``.
- ``check_gpu_step`` / ``measure_gpu_step``: a real synthetic step on the GPU, state restored.
- ``OOMRecorder``: on a CUDA OOM, the allocator snapshot, trace and segment plots and
  flamegraphs, plus a summary and a hint (``start_oom_observer`` for the recipe).
"""

from optimus_preflight.memory.advice import memory_hints
from optimus_preflight.memory.estimate import estimate_step_memory, estimate_training_step, measure_step_memory
from optimus_preflight.memory.gpu_step import check_gpu_step, measure_gpu_step
from optimus_preflight.memory.oom import OOMRecorder, start_oom_observer, summarize_snapshot
from optimus_preflight.memory.params import (
    base_model_param_count,
    bytes_per_weight,
    count_parameters,
    meta_param_count,
    shape_param_count,
)
from optimus_preflight.memory.result import MemoryEstimate
from optimus_preflight.memory.search import largest_fitting_batch, resize_batch

__all__ = [
    "MemoryEstimate",
    "OOMRecorder",
    "base_model_param_count",
    "bytes_per_weight",
    "check_gpu_step",
    "count_parameters",
    "estimate_step_memory",
    "estimate_training_step",
    "largest_fitting_batch",
    "measure_gpu_step",
    "measure_step_memory",
    "memory_hints",
    "meta_param_count",
    "resize_batch",
    "shape_param_count",
    "start_oom_observer",
    "summarize_snapshot",
]
