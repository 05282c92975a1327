"""``trainer.micro_batch_size``: how the batch of one optimizer step is split into micro-batches.

The batch of one optimizer step (per rank) is what the config asks for:
``data.batch_size x trainer.accumulation_steps``. With ``trainer.micro_batch_size`` set, the
loader yields micro-batches of that size and the accumulation becomes
``batch // micro_batch``, so every optimizer step still sees the same samples; the step
runner weights each micro-batch by its count of targets, so the gradient is the full batch's.

``auto`` asks the memory verdict's own estimator (the GPU of ``preflight.memory.target_gib``
or the local one, per rank as ``trainer.strategy`` shards or replicates; host RAM for a
job on the CPU) for the largest micro-batch whose need stays within ``NEAR_LIMIT`` of the
limit (the margin under which the verdict is quiet), with ``memory.search``; then takes
the largest divisor of the batch at most that (accumulated micro-batches must add up to
the batch exactly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import psutil

from optimus_preflight.errors import UserError
from optimus_preflight.memory.result import gib
from optimus_preflight.memory.search import largest_fitting_batch
from optimus_preflight.preflight.analyses.memory_fsdp import PerRankEstimator
from optimus_preflight.preflight.analyses.memory_limit import (
    NEAR_LIMIT,
    MemoryLimit,
    gpu_memory_limit,
    gpu_precision,
    host_memory_held,
    host_memory_limit,
)
from optimus_preflight.preflight.analyses.memory_strategy import ddp_bucket_bytes, rank_plan
from optimus_preflight.preflight.analyses.step_inputs import StepInputs, step_inputs
from optimus_preflight.training import rng
from optimus_preflight.training.distributed import broadcast_object

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from optimus_preflight.preflight.framework.context import PreflightContext

KEY = "trainer.micro_batch_size"
AUTO = "auto"


@dataclass(frozen=True)
class MicroBatchPlan:
    """``micro_batch`` x ``accumulation_steps`` == ``batch`` (one optimizer step, per rank).
    For ``auto``: ``largest`` fits within the headroom (before the divisor), ``need_bytes``
    is the chosen micro-batch's predicted need, of ``limit`` (usable) ``memory``."""

    micro_batch: int
    accumulation_steps: int
    batch: int
    largest: int | None = None
    need_bytes: int | None = None
    limit: MemoryLimit | None = None
    memory: str = ""
    at_least: bool = False

    def describe(self, cfg: DictConfig) -> str:
        """One line for the log: the choice, the batch it keeps, and the prediction."""
        asked = f"data.batch_size={cfg.data.batch_size} x trainer.accumulation_steps={cfg.trainer.accumulation_steps}"
        text = (f"{KEY}={cfg.trainer.micro_batch_size}: micro-batch {self.micro_batch} x {self.accumulation_steps} "
                f"accumulation steps = the {self.batch} samples per optimizer step the config asks ({asked})")
        if self.limit is None:
            return text
        text += (f"; predicted peak {gib(self.need_bytes or 0)} of {gib(self.limit.bytes)} usable {self.memory} memory "
                 f"(headroom: at most {NEAR_LIMIT:.0%} of it)")
        if self.largest == 0:
            text += ": not even a micro-batch of 1 fits, the memory check says what to change"
        elif self.largest is not None and self.largest > self.micro_batch:
            text += (f"; {self.largest}{' or more' if self.at_least else ''} would fit, but {self.batch} is not "
                     f"divisible by it: {self.micro_batch} is its largest divisor that fits")
        return text


def optimizer_step_batch(cfg: DictConfig) -> int:
    """Samples per optimizer step per rank, as the config asks: data.batch_size x trainer.accumulation_steps."""
    return int(cfg.data.batch_size) * int(cfg.trainer.accumulation_steps)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def fixed_plan(batch: int, micro_batch: int) -> MicroBatchPlan:
    """A configured micro-batch: it must divide the batch (accumulation adds whole micro-batches)."""
    if micro_batch > batch or batch % micro_batch:
        choices = ", ".join(map(str, divisors(batch)))
        raise UserError(
            f"{KEY}={micro_batch} does not divide the {batch} samples of one optimizer step "
            f"(data.batch_size x trainer.accumulation_steps): accumulated micro-batches must add up to it exactly",
            key=KEY,
            fix=f"Set {KEY} to one of {choices}, or {KEY}={AUTO} (the largest that fits memory).",
        )
    return MicroBatchPlan(micro_batch, batch // micro_batch, batch)


def largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in divisors(n) if d <= max(cap, 1))


def memory_need(ctx: PreflightContext, inputs: StepInputs, batch: int) -> tuple[MemoryLimit, str, Callable[[int], int]]:
    """The limit the memory verdict judges this job against, its kind (GPU or host), and
    the verdict's need of a micro-batch of n with the accumulation it implies."""

    def accumulating(n: int) -> StepInputs:
        # Gradients stay live across micro-batches: two already show the steady peak.
        return replace(inputs, accumulation_steps=1 if n >= batch else 2)

    limit = gpu_memory_limit(ctx.cfg, ctx.device)
    if limit is not None:
        precision = gpu_precision(ctx)
        plan = rank_plan(ctx)
        if plan.strategy == "fsdp":
            fsdp_precision = "bf16" if precision == "fp16" else precision
            estimators = {k: PerRankEstimator(ctx, replace(inputs, accumulation_steps=k), fsdp_precision) for k in (1, 2)}
            return limit, "GPU", lambda n: estimators[accumulating(n).accumulation_steps].need(plan.world_size, n)
        buckets = ddp_bucket_bytes(ctx.model, plan.world_size)

        def replica_need(n: int) -> int:
            estimate = accumulating(n).estimate(n, device="cuda", precision=precision)
            return estimate.required_bytes - estimate.context_bytes + buckets

        return limit, "GPU", replica_need
    limit = host_memory_limit(ctx, psutil.virtual_memory().available, host_memory_held(ctx))
    precision = ctx.training.plan.precision
    return limit, "host", lambda n: accumulating(n).estimate(n, device="cpu", precision=precision).peak_bytes


def auto_plan(ctx: PreflightContext) -> MicroBatchPlan:
    """The largest micro-batch dividing the batch whose predicted need fits the headroom."""
    batch = optimizer_step_batch(ctx.cfg)
    inputs = step_inputs(ctx)
    limit, memory, need = memory_need(ctx, inputs, batch)
    search = largest_fitting_batch(need, int(NEAR_LIMIT * limit.bytes), min(inputs.batch_size, batch), upper=batch)
    micro = largest_divisor_at_most(batch, search.largest)
    need_bytes = search.probes[micro] if micro in search.probes else need(micro)
    return MicroBatchPlan(micro, batch // micro, batch, largest=search.largest, need_bytes=need_bytes, limit=limit,
                          memory=memory, at_least=search.at_least)


def micro_batch_plan(ctx: PreflightContext) -> MicroBatchPlan | None:
    """The split ``trainer.micro_batch_size`` asks for; None when it is null. ``auto`` is
    decided by the main rank and broadcast: host RAM, for one, differs between ranks, and
    every rank must accumulate the same number of micro-batches."""
    setting = ctx.cfg.trainer.get("micro_batch_size")
    if setting is None:
        return None
    if "batch_size" not in ctx.cfg.data:
        raise UserError(f"{KEY}={setting} splits data.batch_size, which this recipe's data config does not have",
                        key=KEY, fix=f"Set {KEY}=null and choose the batch size in the recipe's data config.")
    batch = optimizer_step_batch(ctx.cfg)
    if setting != AUTO:
        return fixed_plan(batch, int(setting))
    plan = None
    if ctx.training.dist.is_main:
        state = rng.capture()  # the first batch's fetch may draw from the global generators
        try:
            plan = auto_plan(ctx)
        finally:
            rng.restore(state)
    return broadcast_object(plan)
