"""Memory preflight: predict a training step's peak memory without a GPU, check it, observe OOMs.

- Parameter counts: ``param_count_from_empty_model``, ``estimate_params_from_shape``,
  ``estimate_base_model_params``, ``bytes_per_base_weight``.
- ``estimate_step_memory``: two real training steps traced on fake tensors.
- The preflight checks built on it live in ``optimus_preflight.preflight.checks.memory_checks``.
- ``check_model_gpu_memory``: a real synthetic step on the GPU, state restored.
- ``OOMObserver``: on a CUDA OOM, Composer's snapshot, trace and segment plots and
  flamegraphs, plus a summary and a hint (``start_oom_observer`` for the recipe).
"""

from optimus_preflight.memory.advice import memory_hints
from optimus_preflight.memory.estimate import estimate_step_memory, estimate_training_step, measure_step_memory
from optimus_preflight.memory.gpu_step import check_model_gpu_memory, gpu_step_report
from optimus_preflight.memory.oom import OOMObserver, start_oom_observer, summarize_snapshot
from optimus_preflight.memory.params import (
    bytes_per_base_weight,
    count_parameters,
    estimate_base_model_params,
    estimate_params_from_shape,
    param_count_from_empty_model,
)
from optimus_preflight.memory.result import MemoryEstimate
from optimus_preflight.memory.search import largest_fitting_batch, resize_batch

__all__ = [
    "MemoryEstimate",
    "OOMObserver",
    "bytes_per_base_weight",
    "check_model_gpu_memory",
    "count_parameters",
    "estimate_base_model_params",
    "estimate_params_from_shape",
    "estimate_step_memory",
    "estimate_training_step",
    "gpu_step_report",
    "largest_fitting_batch",
    "measure_step_memory",
    "memory_hints",
    "param_count_from_empty_model",
    "resize_batch",
    "start_oom_observer",
    "summarize_snapshot",
]
