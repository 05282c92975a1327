from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager

from torch.utils.data import DataLoader

from optimus_preflight.distributed import all_reduce_sum
from optimus_preflight.step import StepResult, StepRunner
from optimus_preflight.stream import BatchStream


@dataclass
class TrainingIteration:
    runner: StepRunner
    stream: BatchStream


class TrainingIterationMixin:
    """One optimizer step per accumulation window (see ``StepRunner`` and ``BatchStream``).

    Owns ``self.training_iteration``.
    """

    training_iteration: TrainingIteration

    def setup_training_iteration(
        self,
        train_loader: DataLoader,
        should_stop: Callable[[], bool],
        interruptible: Callable[[], ContextManager] = contextlib.nullcontext,
    ) -> None:
        trainer = self.cfg.trainer
        context = self.training_context
        runner = StepRunner(
            self.model,
            self.optimizer,
            self.scheduler,
            context.scaler,
            context.plan,
            self.compute_loss,
            clip_grad_norm=trainer.clip_grad_norm,
            skip_nonfinite=trainer.skip_nonfinite,
            accumulation_steps=trainer.accumulation_steps,
            should_stop=should_stop,
            reduce_sum=all_reduce_sum if context.dist.is_distributed else None,
            world_size=context.dist.world_size,
        )
        stream = BatchStream(train_loader, trainer.accumulation_steps, interruptible)
        self.training_iteration = TrainingIteration(runner, stream)

    def run_training_iteration(self) -> StepResult | None:
        """None when a stop request abandoned the window; the data position is then
        left at the last completed step."""
        iteration = self.training_iteration
        result = iteration.runner.run(iteration.stream.window())
        if result is not None:
            iteration.stream.commit()
        return result
