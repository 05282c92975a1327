"""What the memory checks estimate: the recipe's real builders, loss and first batch.

The model is rebuilt by the recipe's own ``build_model`` under fake mode (no memory),
so the estimate sees exactly the architecture, dtype and init the run will use; without
a recipe, a fake copy of the live model stands in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from optimus_preflight.memory.estimate import estimate_training_step
from optimus_preflight.memory.fake_copy import fake_copy_factory, optimizer_factory_like
from optimus_preflight.memory.result import MemoryEstimate
from optimus_preflight.memory.search import resize_batch
from optimus_preflight.preflight.data_access.guard import fetch_first_batch, preflight_timeout
from optimus_preflight.training.batches import batch_size_of

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def first_batch(ctx: PreflightContext) -> Any:
    """The real first batch left by ``data.first_batch``, or one drawn from the loader
    under ``preflight.first_batch_timeout_s`` (RuntimeError naming the hang, not a wait
    without end, when it does not come)."""
    batch = ctx.artifacts.first_batch
    if batch is None:
        batch = fetch_first_batch(ctx.train_loader, preflight_timeout(ctx)).batches[0]
    return batch


@dataclass
class StepInputs:
    model_fn: Callable[[], nn.Module]
    build_optimizer: Callable[[nn.Module], Optimizer]
    loss_fn: Callable[[nn.Module, Any], Any]
    batch: Any
    accumulation_steps: int

    @property
    def batch_size(self) -> int:
        return batch_size_of(self.batch)

    def estimate(self, micro_batch: int, *, device: str, precision: str) -> MemoryEstimate:
        batch = resize_batch(self.batch, micro_batch, self.batch_size)
        return estimate_training_step(
            self.model_fn,
            batch,
            self.loss_fn,
            self.build_optimizer,
            precision=precision,
            device=device,
            accumulation_steps=self.accumulation_steps,
        )


def step_inputs(ctx: PreflightContext) -> StepInputs:
    recipe = getattr(ctx, "recipe", None)
    model_fn = getattr(recipe, "build_model", None) or fake_copy_factory(ctx.model)
    build_optimizer = getattr(recipe, "build_optimizer", None) or optimizer_factory_like(ctx.optimizer, ctx.model)
    return StepInputs(
        model_fn=model_fn,
        build_optimizer=build_optimizer,
        loss_fn=ctx.compute_loss,
        batch=first_batch(ctx),
        accumulation_steps=int(ctx.cfg.trainer.accumulation_steps),
    )
