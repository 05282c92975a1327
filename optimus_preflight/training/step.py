"""One optimizer step = one accumulation window, as a component tested on its own."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Union

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training.batches import batch_size_of, move_to_device
from optimus_preflight.training.contracts import check_loss_output
from optimus_preflight.training.distributed import all_reduce_sum
from optimus_preflight.training.gradients import clip_grads_, params_with_grads, scale_grads_, total_norm
from optimus_preflight.training.precision import PrecisionPlan

if TYPE_CHECKING:
    from optimus_preflight.config.schema import TrainerConfig
    from optimus_preflight.training.training_context import TrainingContext

Count = Union[int, torch.Tensor]
LossFn = Callable[[nn.Module, Any], Union[torch.Tensor, tuple[torch.Tensor, Count]]]


@dataclass
class PhaseTimes:
    data_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0


@dataclass
class StepResult:
    # Tensors stay on the device: reading them is a host sync, done only when logged.
    loss: torch.Tensor
    grad_norm: torch.Tensor
    stepped: bool
    lrs: list[float]
    samples: int
    micro_batches: int
    times: PhaseTimes = field(default_factory=PhaseTimes)
    # Targets the loss averages over (this rank): weights the loss when ranks are combined.
    count: Count = 1


def split_loss_output(output: Any, batch: Any) -> tuple[torch.Tensor, Count]:
    """``compute_loss`` returns a mean loss, or ``(mean loss, number of targets it averages)``."""
    loss, count = check_loss_output(output)  # a wrong return is one line naming compute_loss, not a traceback
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TypeError(
            "compute_loss must return a scalar loss tensor or (loss, count); "
            f"got {type(loss).__name__} with shape {getattr(loss, 'shape', None)}"
        )
    if count is None:
        count = batch_size_of(batch)
    return loss.reshape(()), count


def accumulation_context(model: nn.Module, is_last_microbatch: bool) -> contextlib.AbstractContextManager:
    """DDP all-reduces on every backward unless told not to; only the window's last counts."""
    if not is_last_microbatch and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


class StepRunner:
    """Runs forward/backward over a window of micro-batches and one optimizer update.

    Each micro-batch loss is weighted by its share of the window's targets, so the
    accumulated gradient equals the full-batch gradient: also for a short last window
    and for token losses whose micro-batches hold different numbers of tokens.
    Weights use a reference count known after the first micro-batch (its count times
    the window length); one correction multiply after the window makes the result
    exact without holding the whole window in memory.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        scheduler: Any,
        scaler: torch.amp.GradScaler,
        plan: PrecisionPlan,
        compute_loss: LossFn,
        *,
        clip_grad_norm: float | None,
        skip_nonfinite: bool,
        accumulation_steps: int,
        should_stop: Callable[[], bool] = lambda: False,
        reduce_sum: Callable[[Count], torch.Tensor] | None = None,
        world_size: int = 1,
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.plan = plan
        self.compute_loss = compute_loss
        self.clip_grad_norm = clip_grad_norm
        self.skip_nonfinite = skip_nonfinite
        self.accumulation_steps = accumulation_steps
        self.should_stop = should_stop
        # Under DDP counts are summed over ranks: the gradient is averaged over every
        # rank's targets, and DDP's own mean over ranks is undone by ``world_size``.
        self.reduce_sum = reduce_sum
        self.world_size = world_size
        self._global_reference: torch.Tensor | None = None
        self.non_blocking = plan.device.type == "cuda"
        # Called after unscaling and clipping, before the optimizer step, while the final
        # gradients exist: the callbacks' before_optimizer_step (optimus_preflight.callbacks).
        self.optimizer_step_hooks: list[Callable[[], None]] = []
        # Around each micro-batch's forward and backward (TrainingIterationMixin's, which a user may override).
        self.accumulation_context: Callable[[nn.Module, bool], contextlib.AbstractContextManager] = accumulation_context

    def _reference(self, first_count: Count) -> Count:
        if self.reduce_sum is None:
            return first_count * self.accumulation_steps
        if self._global_reference is None:  # one collective, on the first window only
            self._global_reference = self.reduce_sum(first_count) * self.accumulation_steps
        return self._global_reference

    def _correction(self, reference: Count, count_sum: Count) -> Count:
        if self.reduce_sum is None:
            return reference / count_sum
        return self.world_size * reference / self.reduce_sum(count_sum)

    def run(self, window: Iterator[tuple[Any, bool]]) -> StepResult | None:
        """Returns None when a stop was requested mid-window: the partial gradients are
        dropped, so the step boundary stays clean for a checkpoint."""
        times = PhaseTimes()
        loss_sum: torch.Tensor | float = 0.0
        count_sum: Count = 0
        reference: Count = 1
        samples = micro_batches = 0
        clock = time.perf_counter()
        for batch, is_last in window:
            batch = move_to_device(batch, self.plan.device, self.non_blocking)
            started = time.perf_counter()
            times.data_s += started - clock
            with self.accumulation_context(self.model, is_last):
                with self.plan.autocast():
                    loss, count = split_loss_output(self.compute_loss(self.model, batch), batch)
                if micro_batches == 0:
                    reference = self._reference(count)
                forward_done = time.perf_counter()
                weight = count / reference
                if isinstance(weight, torch.Tensor):
                    weight = weight.to(loss.device, loss.dtype)
                self.scaler.scale(loss * weight).backward()
            clock = time.perf_counter()
            times.forward_s += forward_done - started
            times.backward_s += clock - forward_done
            loss_sum = loss_sum + loss.detach().float() * count
            count_sum = count_sum + count
            samples += batch_size_of(batch)
            micro_batches += 1
            if not is_last and self.should_stop():
                self.optimizer.zero_grad(set_to_none=True)
                return None
        started = time.perf_counter()
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        params = params_with_grads(self.optimizer)
        self.scaler.unscale_(self.optimizer)
        correction = self._correction(reference, count_sum)
        if isinstance(correction, torch.Tensor):
            correction = correction.to(torch.float32)
        scale_grads_(params, correction)
        grad_norm = total_norm(params)
        if self.clip_grad_norm is not None:
            clip_grads_(params, self.clip_grad_norm, grad_norm)
        for hook in self.optimizer_step_hooks:
            hook()
        stepped = self._optimizer_step(grad_norm)
        if stepped and self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        times.optimizer_s = time.perf_counter() - started
        return StepResult(
            loss=loss_sum / count_sum,
            grad_norm=grad_norm,
            stepped=stepped,
            lrs=lrs,
            samples=samples,
            micro_batches=micro_batches,
            times=times,
            count=count_sum,
        )

    def _optimizer_step(self, grad_norm: torch.Tensor) -> bool:
        if self.scaler.is_enabled():
            # The scaler skips the step itself when it found inf/NaN while unscaling.
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return bool(torch.isfinite(grad_norm))
        if self.skip_nonfinite and not bool(torch.isfinite(grad_norm)):
            return False
        self.optimizer.step()
        return True


def runner_from_config(
    trainer: TrainerConfig,
    context: TrainingContext,
    model: nn.Module,
    optimizer: Optimizer,
    compute_loss: LossFn,
    *,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    accumulation_steps: int | None = None,
    clip: bool = True,
    should_stop: Callable[[], bool] = lambda: False,
) -> StepRunner:
    """The StepRunner for ``trainer`` (the trainer config) in ``context`` (a
    TrainingContext): how the training loop steps, and so how every preflight step run
    steps too. The keywords are what a trial step may change: another scaler (a copy),
    another window length, no clipping (to compare raw gradients)."""
    distributed = context.dist.is_distributed
    return StepRunner(
        model,
        optimizer,
        scheduler,
        scaler if scaler is not None else context.scaler,
        context.plan,
        compute_loss,
        clip_grad_norm=trainer.clip_grad_norm if clip else None,
        skip_nonfinite=trainer.skip_nonfinite,
        accumulation_steps=accumulation_steps or trainer.accumulation_steps,
        should_stop=should_stop,
        reduce_sum=all_reduce_sum if distributed else None,
        world_size=context.dist.world_size,
    )
