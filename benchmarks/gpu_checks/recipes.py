"""Recipe subclasses the GPU checks run through the CLI (``recipe._target_=benchmarks.gpu_checks.recipes.X``,
importable because the CLI runs with the repository root as its working directory)."""

from __future__ import annotations

import os

import torch
from torch import nn

from optimus_preflight.recipes.char_lm import CharLMRecipe

# Large enough that fp16's backward overflows at any GradScaler scale above ~1e-3 for the
# tiny recipe's 512 targets, while the loss itself (computed in fp32 under autocast) stays finite.
OVERFLOW = 1e8
EMULATED_GIB = "GPU_CHECK_EMULATED_GIB"
BASELINE_USED = "GPU_CHECK_BASELINE_USED_BYTES"


class OverflowCharLM(CharLMRecipe):
    """The default recipe with its loss scaled by 1e8: in fp16 every backward overflows, so the
    GradScaler must skip every step, halve its scale each time, and the scheduler must hold."""

    def compute_loss(self, model: nn.Module, batch):
        loss, count = super().compute_loss(model, batch)
        return loss * OVERFLOW, count


def emulate_gpu_size() -> None:
    """Cap this process's caching allocator so the GPU behaves like one of
    ``$GPU_CHECK_EMULATED_GIB`` GiB: what other processes hold (``$GPU_CHECK_BASELINE_USED_BYTES``,
    measured by the parent before it started this one) is left out, this process's CUDA
    context is counted in, as on a card of that size."""
    gib = os.environ.get(EMULATED_GIB)
    if not gib or not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(device)
    others = int(os.environ.get(BASELINE_USED, "0"))
    own_context = max(total - free - torch.cuda.memory_reserved(device) - others, 0)
    cap = float(gib) * (1 << 30) - own_context
    torch.cuda.set_per_process_memory_fraction(max(cap / total, 0.001), device)
    print(f"gpu_check: emulating a {float(gib):g} GiB GPU: allocator cap {int(cap)} bytes, "
          f"own CUDA context {own_context} bytes", flush=True)


class CappedCharLM(CharLMRecipe):
    """The default recipe on a GPU made to look smaller (see ``emulate_gpu_size``)."""

    def build_model(self) -> nn.Module:
        emulate_gpu_size()
        return super().build_model()
