"""``trainer.compile``: torch.compile of the model, in place, after the preflight.

In place (``nn.Module.compile``), so parameter names and checkpoint keys stay those of
the eager model: a compiled run resumes uncompiled and back. Under FSDP each block is
compiled on its own (the all-gathers between blocks stay outside the graphs). Compiling
after the preflight keeps its checks and fake-tensor estimate on the eager module.

``CompileWatch`` times the warm-up (the first compiled step, where the graphs are built)
and notices a recompilation storm: a model recompiled again and again because its input
shapes keep changing, each recompile costing what the warm-up cost.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from torch import nn

from optimus_preflight.errors import UserError
from optimus_preflight.training.distributed import unwrap
from optimus_preflight.training.sharding import find_blocks

log = logging.getLogger("optimus_preflight")

# Recompiles per compiled module after the warm-up that make a storm: a new shape costs
# one (automatic dynamic shapes then cover most), torch gives up on a frame after 8.
STORM_RECOMPILES = 4


def check_compile_config(trainer: Any) -> None:
    """Before any work: a backend torch does not know would fail only after the preflight."""
    if not trainer.compile:
        return
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if trainer.compile_backend not in known:
        raise UserError(f"trainer.compile_backend={trainer.compile_backend!r} is not a torch.compile backend",
                        key="trainer.compile_backend",
                        fix=f"Set trainer.compile_backend=inductor (or one of {', '.join(sorted(known))}).")


def compile_options(trainer: Any) -> dict[str, Any]:
    options: dict[str, Any] = {"backend": trainer.compile_backend, "dynamic": trainer.compile_dynamic}
    if trainer.compile_mode is not None:
        options["mode"] = trainer.compile_mode
    return options


def compile_model(model: nn.Module, trainer: Any, strategy: str) -> list[nn.Module]:
    """Compile in place; returns the modules compiled."""
    inner = unwrap(model)
    targets = find_blocks(inner, list(trainer.fsdp.block_classes)) if strategy == "fsdp" else [inner]
    options = compile_options(trainer)
    for module in targets or [inner]:
        module.compile(**options)
    log.info("torch.compile (%s) of %s; the first step builds the graphs",
             ", ".join(f"{k}={v}" for k, v in options.items() if v is not None),
             f"{len(targets)} blocks" if strategy == "fsdp" else type(inner).__name__)
    return targets


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


class CompileWatch:
    """The warm-up time, and the recompiles after it."""

    def __init__(self, modules: int = 1) -> None:
        self.modules = max(modules, 1)
        self.warmup_s: float | None = None
        self.recompiles = 0
        self._frames_after_warmup = 0
        self._started = 0.0
        self._warned = False

    def start_step(self) -> None:
        self._started = time.perf_counter()

    def end_step(self, step: int) -> None:
        if self.warmup_s is None:
            self.warmup_s = time.perf_counter() - self._started
            self._frames_after_warmup = _frames_compiled()
            log.info("torch.compile warm-up: the first step took %.1f s (building the graphs); "
                     "samples_per_s starts after it", self.warmup_s)
            return
        self.recompiles = _frames_compiled() - self._frames_after_warmup
        if self.recompiles >= STORM_RECOMPILES * self.modules and not self._warned:
            self._warned = True
            log.warning(
                "torch.compile recompiled %d times since the warm-up (by step %d, %d module(s) compiled): the inputs' shapes keep changing "
                "(e.g. a varying sequence length), and each recompile costs about the warm-up (%.1f s). Fix: "
                "trainer.compile_dynamic=true (one graph for all lengths), or pad batches to a few bucket lengths; "
                "or trainer.compile=false.", self.recompiles, step, self.modules, self.warmup_s or 0.0)

    def summary(self) -> dict[str, Any]:
        return {"compile_warmup_s": None if self.warmup_s is None else round(self.warmup_s, 3),
                "compile_recompiles": self.recompiles}
