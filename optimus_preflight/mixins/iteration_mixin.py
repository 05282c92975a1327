from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ClassVar, ContextManager

from torch.utils.data import DataLoader

from optimus_preflight.mixins.contracts import IterationHost
from optimus_preflight.training.step import StepResult, StepRunner, runner_from_config
from optimus_preflight.training.stream import BatchStream
from optimus_preflight.training.training_context import TrainingContext


@dataclass
class TrainingIteration:
    runner: StepRunner
    stream: BatchStream


class TrainingIterationMixin:
    """One optimizer step per accumulation window (see ``StepRunner`` and ``BatchStream``).

    Owns ``self.training_iteration``.
    """

    HOST: ClassVar[type] = IterationHost
    training_iteration: TrainingIteration

    def setup_training_iteration(
        self: IterationHost,
        context: TrainingContext,
        train_loader: DataLoader,
        should_stop: Callable[[], bool],
        fetch_guard: Callable[[], ContextManager] = contextlib.nullcontext,
    ) -> TrainingIteration:
        """``fetch_guard`` wraps each blocking fetch (a stop signal ends the wait)."""
        runner = runner_from_config(self.cfg.trainer, context, self.model, self.optimizer, self.compute_loss,
                                    scheduler=self.scheduler, should_stop=should_stop)
        self.training_iteration = TrainingIteration(runner, BatchStream(train_loader, self.cfg.trainer.accumulation_steps, fetch_guard))
        return self.training_iteration

    def run_training_iteration(self) -> StepResult | None:
        """None when a stop request abandoned the window; the data position is then
        left at the last completed step."""
        iteration = self.training_iteration
        result = iteration.runner.run(iteration.stream.window())
        if result is not None:
            iteration.stream.commit()
        return result
