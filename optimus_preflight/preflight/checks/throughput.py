"""A short timed burst of real training steps: s/step, time waiting for data, ETA."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.trial_steps import make_runner
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

BURST_STEPS = 3  # timed, after one warm-up step
BURST_BUDGET_S = 2.0
INPUT_BOUND_FRACTION = 0.5
# An input-bound run is worth a warning only when the wait adds up: a tiny model whose step
# is as short as its fetch is "input-bound" by share, on a loaded machine by chance, yet a
# fix would save seconds. Below this projected wait over the remaining steps, a note.
MIN_WAIT_WORTH_FIXING_S = 60.0


def _window(first: Any, iterator: Any, size: int) -> Iterator[tuple[Any, bool]]:
    """Like BatchStream.window: the next batch is read before the current one is handed
    out, so fetching happens inside the step, where StepRunner times it as data wait."""
    pending = first
    for index in range(size):
        upcoming = next(iterator, None) if index + 1 < size else None
        yield pending, upcoming is None
        if upcoming is None:
            return
        pending = upcoming


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class ThroughputCheck(Check):
    """A short timed burst of real steps: s/step, share of time waiting for data, ETA."""

    name = "step.throughput"
    stage = Stage.STEP
    codes = ("DATA_BOUND",)
    requires = (FIRST_STEP,)
    timed = True

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        steps = ctx.cfg.trainer.accumulation_steps
        times: list[float] = []
        waits: list[float] = []
        guard = DataGuard(ctx, self.name, findings)
        with preserved_training_state(ctx):
            ctx.model.train()
            runner = make_runner(ctx, ctx.model, ctx.optimizer, scheduler=ctx.scheduler)
            # Every batch under the timeout: one that never comes (in a worker or in this
            # process) is reported here, naming its frame, instead of holding preflight.
            with guard.batches(ctx.train_loader, "the throughput burst") as iterator:
                started = time.perf_counter()
                for index in range(BURST_STEPS + 1):
                    _sync(ctx.device)
                    begin = time.perf_counter()
                    first = next(iterator, None)
                    if first is None:
                        break  # a tiny dataset: fewer timed steps
                    fetched = time.perf_counter()
                    result = runner.run(_window(first, iterator, steps))
                    _sync(ctx.device)
                    if index:  # the first step warms up allocators and kernels
                        times.append(time.perf_counter() - begin)
                        waits.append(result.times.data_s + fetched - begin)
                    if time.perf_counter() - started > BURST_BUDGET_S and times:
                        break
        if not times:
            return
        per_step = sum(times) / len(times)
        waiting = sum(waits) / sum(times)
        remaining = ctx.cfg.trainer.max_steps - getattr(getattr(ctx.recipe, "state", None), "step", 0)
        eta = per_step * remaining
        bound = "input-bound" if waiting > INPUT_BOUND_FRACTION else "compute-bound"
        findings.data.update(s_per_step=round(per_step, 5), data_wait_fraction=round(waiting, 4), bound=bound,
                             steps_timed=len(times), eta_s=round(eta, 3), remaining_steps=remaining)
        findings.data["summary"] = (f"{per_step:.3f} s/step ({bound}, {100 * waiting:.0f}% waiting for data), "
                                    f"ETA {format_duration(eta)} for {remaining} steps")
        if waiting <= INPUT_BOUND_FRACTION:
            return
        workers = getattr(ctx.train_loader, "num_workers", 0)
        wasted = waiting * eta
        findings.data["projected_wait_s"] = round(wasted, 3)
        if wasted < MIN_WAIT_WORTH_FIXING_S:
            findings.info("DATA_BOUND", f"{100 * waiting:.0f}% of each step waits for data (num_workers={workers}), "
                                        f"about {format_duration(wasted)} over the run: not worth a change")
            return
        findings.warning(
            "DATA_BOUND",
            f"{100 * waiting:.0f}% of each step waits for data (num_workers={workers}), about "
            f"{format_duration(wasted)} of the {format_duration(eta)} ETA: the model is starved and the run takes "
            "longer than it needs",
            "Raise data.num_workers, set data.persistent_workers=true (and data.pin_memory=true on a GPU), or "
            "move decoding/augmentation out of the loading path.",
            "data.num_workers",
            code_fix="Raise num_workers of the DataLoader your build_dataloaders() returns, pass "
                     "persistent_workers=True (and pin_memory=True on a GPU), or move decoding/augmentation out of "
                     "the loading path.",
        )
