"""Which training step the GPU memory verdict judges: the strategy and ranks the run will use.

``trainer.strategy`` decides what one rank holds, ``preflight.memory.world_size`` (else the
run's own world size) how many ranks there are:

- ``ddp`` (and one process of any strategy but fsdp): a full replica per rank, i.e. the
  parameters, gradients, optimizer state and the activations of the per-rank micro-batch
  (``data.batch_size``), plus DDP's gradient buckets when there is more than one rank:
  DDP's reducer copies every trainable gradient into flat buckets
  (``gradient_as_bucket_view=False``, torch's default and ours), so a replica holds each
  gradient twice during the all-reduce. The rank count does not shrink a replica.
- ``fsdp``: one rank of an FSDP2 job (memory_fsdp), whose shards shrink with the ranks.
- ``auto``: under torchrun the strategy setup placed the model with; else the same rule
  (``training.strategy.auto_strategy``) applied to the target GPU, which the verdict states.

When a replica does not fit (or is within 10% of the limit), the advice names
``trainer.strategy=fsdp`` with what one rank would need sharded, at these ranks or the
fewest that fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from optimus_preflight.memory.result import GIB, gib
from optimus_preflight.preflight.analyses.memory_fsdp import (
    WORLD_KEY,
    PerRankEstimator,
    smallest_world_size,
)
from optimus_preflight.preflight.analyses.memory_limit import NEAR_LIMIT, MemoryLimit
from optimus_preflight.preflight.analyses.step_inputs import StepInputs
from optimus_preflight.preflight.framework import Findings
from optimus_preflight.training.distributed import unwrap
from optimus_preflight.training.strategy import auto_strategy

if TYPE_CHECKING:
    from torch import nn

    from optimus_preflight.preflight.framework.context import PreflightContext

STRATEGY_KEY = "trainer.strategy"


@dataclass(frozen=True)
class RankPlan:
    """``strategy``: ``replica`` (the whole model on each rank: DDP, or one process) or
    ``fsdp``; ``world_size``: the ranks; ``reason``: where the strategy came from."""

    strategy: str
    world_size: int
    reason: str

    @property
    def label(self) -> str:
        """The strategy as the report names it: ``single`` (one device), ``ddp`` or ``fsdp``."""
        if self.strategy == "fsdp":
            return "fsdp"
        return "ddp" if self.world_size > 1 else "single"

    def subject(self, checkpointing: bool = False) -> str:
        """Who needs the memory, as the verdict's sentence starts."""
        if self.strategy == "fsdp":
            return f"one rank of {self.world_size} (FSDP2{', activation checkpointing' if checkpointing else ''})"
        if self.world_size > 1:
            return f"one rank of {self.world_size} (DDP: a full replica)"
        return "the training step"


def target_device_bytes(ctx: PreflightContext) -> int | None:
    """One rank's total GPU memory: ``preflight.memory.target_gib``, else the local GPU's."""
    target = ctx.cfg.preflight.memory.target_gib
    if target is not None:
        return int(float(target) * GIB)
    if ctx.device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(ctx.device).total_memory
    return None


def parameter_count(model: nn.Module) -> int:
    """Parameters of the unwrapped model (meta ones too: only shapes are read)."""
    return sum(p.numel() for p in unwrap(model).parameters())


def rank_plan(ctx: PreflightContext) -> RankPlan:
    """The strategy and ranks of the step to judge (the module docstring)."""
    configured = getattr(ctx.cfg.preflight.memory, "world_size", None)
    dist = getattr(getattr(ctx, "training", None), "dist", None)
    distributed = bool(dist is not None and dist.is_distributed)
    world_size = int(configured) if configured is not None else int(dist.world_size) if distributed else 1
    requested = str(ctx.cfg.trainer.strategy)
    placed = getattr(getattr(ctx, "recipe", None), "strategy", None)
    if distributed and placed in ("ddp", "fsdp"):  # setup resolved the strategy (auto included)
        chosen = "fsdp" if placed == "fsdp" else "replica"
        reason = f"{STRATEGY_KEY}={requested}" + (f": setup chose {placed}" if requested == "auto" else "")
        return RankPlan(chosen, world_size, reason)
    if requested == "fsdp":
        return RankPlan("fsdp", world_size, f"{STRATEGY_KEY}=fsdp")
    if requested == "auto":
        if world_size == 1:
            return RankPlan("replica", 1, f"{STRATEGY_KEY}=auto with one rank: one process never shards")
        device_bytes = target_device_bytes(ctx)
        if device_bytes is not None:
            chosen, why = auto_strategy(parameter_count(ctx.model), device_bytes)
            return RankPlan("fsdp" if chosen == "fsdp" else "replica", world_size,
                            f"{STRATEGY_KEY}=auto chose {chosen}: {why}")
    return RankPlan("replica", world_size, f"{STRATEGY_KEY}={requested}")


def ddp_bucket_bytes(model: nn.Module, world_size: int) -> int:
    """DDP's gradient buckets: a copy of every trainable gradient, on more than one rank."""
    if world_size <= 1:
        return 0
    return sum(p.numel() * p.element_size() for p in unwrap(model).parameters() if p.requires_grad)


def advise_sharding(ctx: PreflightContext, findings: Findings, *, limit: MemoryLimit, inputs: StepInputs,
                    precision: str, plan: RankPlan, need: int) -> None:
    """After a replica's verdict: when it does not fit or is near the limit, what one rank
    would need under ``trainer.strategy=fsdp`` (at these ranks, else the fewest that fit),
    put first in the verdict's fix when sharding makes the step fit as it is."""
    if plan.strategy != "replica" or need <= NEAR_LIMIT * limit.bytes:
        return
    estimator = PerRankEstimator(ctx, inputs, "bf16" if precision == "fp16" else precision)
    batch_size = inputs.batch_size
    probes: dict[int, int] = {}
    ranks: int | None = None
    if plan.world_size > 1:
        probes[plan.world_size] = estimator.need(plan.world_size, batch_size)
        if probes[plan.world_size] <= limit.bytes:
            ranks = plan.world_size
    if ranks is None:
        ranks, more = smallest_world_size(lambda n: estimator.need(n, batch_size), limit.bytes, plan.world_size)
        probes.update(more)
    findings.data["fsdp_world_size_probes"] = {str(n): v for n, v in sorted(probes.items())}
    issue = next((i for i in findings.issues if i.code in ("MEM1", "MEM2")), None)
    if ranks is None:
        most = max(probes, default=None)
        if issue is not None and most is not None:
            issue.message += (f" Sharding with {STRATEGY_KEY}=fsdp does not fit data.batch_size={batch_size} either: "
                              f"one rank of {most} would still need {gib(probes[most])}.")
        return
    findings.data.update(fsdp_world_size=ranks, fsdp_need_bytes=probes[ranks])
    if issue is None:
        return
    if ranks == plan.world_size:
        issue.message += (f" Sharded with {STRATEGY_KEY}=fsdp over the same {ranks} ranks, one rank would need "
                          f"{gib(probes[ranks])} (fits).")
        fix = f"Set {STRATEGY_KEY}=fsdp: sharded over {ranks} ranks one rank needs {gib(probes[ranks])}."
    else:
        issue.message += (f" Sharded with {STRATEGY_KEY}=fsdp, the fewest ranks that fit data.batch_size={batch_size} "
                          f"are {ranks} (one rank of {ranks} needs {gib(probes[ranks])}).")
        fix = (f"Set {STRATEGY_KEY}=fsdp and shard over {ranks} GPUs ({WORLD_KEY}={ranks}, and launch that many "
               f"ranks): one rank of {ranks} needs {gib(probes[ranks])}.")
    issue.fix = f"{fix} {issue.fix}"
    if issue.code == "MEM1":  # sharding makes the step fit as it is: the key to change first
        issue.config_key = STRATEGY_KEY

