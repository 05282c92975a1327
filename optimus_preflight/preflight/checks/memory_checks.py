"""Preflight checks: will the training step fit the GPU (local or a target size) and host RAM?

Each check estimates two real training steps on fake tensors (the recipe's model,
optimizer, loss and first batch, the configured precision and accumulation); the GPU
check judges one rank of the job ``trainer.strategy`` describes (memory_strategy): a full
replica under DDP (plus its gradient buckets), one rank of an FSDP2 job under fsdp
(memory_fsdp), over ``preflight.memory.world_size`` ranks or the run's own. Each compares
the peak with the usable memory and, when it does not fit or is within 10% of the
limit, searches the estimator for the largest micro-batch that fits.

Issue codes: MEM0 not applicable (info), MEM1/MEM2 GPU memory exceeded/within 10%,
MEM3 the estimate fell back to the formula, MEM4/MEM5 host RAM exceeded/within 10%,
MEM6 preflight.memory.target_gib too small to hold even the CUDA context, O11 a step whose
peak is foreach's optimizer temporaries (the step re-estimated with ``foreach=False`` and,
where the optimizer has it, ``fused=True``, to say what each would need).
Artifacts left for later consumers: ``artifacts.memory_estimate`` (the ``MemoryEstimate``) and
``artifacts.largest_micro_batch`` (for the OOM observer's hint).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import psutil

from optimus_preflight.memory import cuda_rules, optimizer_paths
from optimus_preflight.memory.analytic import EstimateError
from optimus_preflight.memory.result import GIB, gib
from optimus_preflight.preflight.analyses.memory_fsdp import check_per_rank, per_rank_need_of
from optimus_preflight.preflight.analyses.memory_limit import (
    gpu_memory_limit,
    gpu_precision,
    host_memory_held,
    host_memory_limit,
)
from optimus_preflight.preflight.analyses.memory_strategy import RankPlan, advise_sharding, ddp_bucket_bytes, rank_plan
from optimus_preflight.preflight.analyses.memory_verdict import judge, optimizer_step_finding
from optimus_preflight.preflight.analyses.step_inputs import StepInputs, step_inputs
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def smallest_target_gib(usable_fraction: float, reserve_gib: float) -> float:
    """The GPU size (GiB) below which the CUDA context alone fills what the target's
    usable share, less the reserve, leaves: ``gpu_memory_limit`` is <= 0 there."""
    context_gib = cuda_rules.CUDA_CONTEXT_BYTES / GIB
    return max(context_gib / usable_fraction, context_gib + reserve_gib)


def undersized_target(memory: Any) -> tuple[str, str] | None:
    """(message, fix) when ``preflight.memory.target_gib`` cannot even hold the CUDA
    context: a usable memory at or below zero would read as a negative size and make every
    batch size "not fit"."""
    if memory.target_gib is None:
        return None
    smallest = smallest_target_gib(float(memory.usable_fraction), float(memory.reserve_gib))
    if float(memory.target_gib) > smallest:
        return None
    context = cuda_rules.CUDA_CONTEXT_BYTES
    return (
        f"preflight.memory.target_gib={memory.target_gib:g} is too small to hold the {gib(context)} CUDA context: "
        f"after preflight.memory.usable_fraction={memory.usable_fraction:g} and the {memory.reserve_gib:g} GiB "
        "reserve (preflight.memory.reserve_gib) nothing is left for tensors. target_gib is the total memory of the "
        "GPU to check, in GiB",
        f"Set preflight.memory.target_gib to the GPU's total memory, above {smallest:.2f} "
        "(e.g. preflight.memory.target_gib=24 for a 24 GiB GPU), or null to check the local device.",
    )


class VRAMHeadroomCheck(Check):
    """Predicted peak of a training step vs the usable memory of the GPU it will run on."""

    name = "memory.vram_headroom"
    stage = Stage.MODEL
    codes = ("MEM0", "MEM1", "MEM2", "MEM3", "MEM6", "O11")
    requires = ("data.first_batch",)
    needs_weights = False  # fake tensors: the verdict for a model kept on the meta device

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        try:
            self._judge(ctx, findings)
        except EstimateError as error:  # a model neither traced nor copied: say so, judge nothing
            unestimated(findings, error)

    def _judge(self, ctx: PreflightContext, findings: Findings) -> None:
        undersized = undersized_target(ctx.cfg.preflight.memory)
        if undersized is not None:
            findings.data["summary"] = "preflight.memory.target_gib leaves no memory for tensors"
            findings.error("MEM6", *undersized, "preflight.memory.target_gib")
            return
        limit = gpu_memory_limit(ctx.cfg, ctx.device)
        if limit is None:
            findings.data.update(applicable=False, summary="no GPU in this job (set preflight.memory.target_gib to check one)")
            findings.info(
                "MEM0",
                "No GPU to check: the job trains on the CPU and preflight.memory.target_gib is not set.",
                "Set preflight.memory.target_gib=80 to check the job for an 80 GiB GPU from this machine.",
                "preflight.memory.target_gib",
            )
            return
        inputs = step_inputs(ctx)
        precision = gpu_precision(ctx)
        plan = rank_plan(ctx)
        findings.data.update(strategy=plan.label, world_size=plan.world_size, strategy_reason=plan.reason)
        if plan.strategy == "fsdp":  # one rank of an FSDP2 job (memory_fsdp)
            estimate = check_per_rank(ctx, findings, limit, inputs, precision, plan.world_size)
            ctx.artifacts.memory_estimate = estimate
            ctx.artifacts.largest_micro_batch = findings.data.get("largest_micro_batch")
            optimizer_step_finding(findings, what="GPU", estimate=estimate, need=findings.data["need_bytes"],
                                   limit=limit, inputs=inputs,
                                   need_of=per_rank_need_of(ctx, inputs, precision, plan.world_size),
                                   has_fused=optimizer_paths.supports_fused(ctx.optimizer))
            mention_auto(findings, plan)
            return
        # A replica (DDP, or one process): what the rank count does not shrink.
        ddp = ddp_bucket_bytes(ctx.model, plan.world_size)

        def need_for_batch(micro_batch: int) -> int:
            estimate = inputs.estimate(micro_batch, device="cuda", precision=precision)
            return estimate.required_bytes - estimate.context_bytes + ddp

        estimate = inputs.estimate(inputs.batch_size, device="cuda", precision=precision)
        need = estimate.required_bytes - estimate.context_bytes + ddp
        ctx.artifacts.memory_estimate = estimate
        findings.data.update(limit=asdict(limit), precision=precision, ddp_bucket_bytes=ddp)
        extra = f"; + {gib(estimate.workspace_bytes)} cuBLAS workspaces"
        if estimate.allocator_peak_bytes and estimate.allocator_peak_bytes > estimate.peak_bytes:
            extra += f"; + {gib(estimate.allocator_peak_bytes - estimate.peak_bytes)} of allocator blocks not split"
        if ddp:
            extra += f"; + {gib(ddp)} DDP gradient buckets"
        judge(
            findings,
            what="GPU",
            estimate=estimate,
            need=need,
            limit=limit,
            inputs=inputs,
            need_for_batch=need_for_batch,
            codes=("MEM1", "MEM2"),
            precision=precision,
            extra=extra,
            who="step" if plan.world_size == 1 else plan.subject(),
        )
        ctx.artifacts.largest_micro_batch = findings.data.get("largest_micro_batch")
        advise_sharding(ctx, findings, limit=limit, inputs=inputs, precision=precision, plan=plan, need=need)

        def need_of(other: StepInputs) -> int:
            other_estimate = other.estimate(other.batch_size, device="cuda", precision=precision)
            return other_estimate.required_bytes - other_estimate.context_bytes + ddp

        optimizer_step_finding(findings, what="GPU", estimate=estimate, need=need, limit=limit, inputs=inputs,
                               need_of=need_of, has_fused=optimizer_paths.supports_fused(ctx.optimizer))
        mention_auto(findings, plan)


def mention_auto(findings: Findings, plan: RankPlan) -> None:
    """trainer.strategy=auto: the summary says what it chose and why."""
    if "=auto" in plan.reason:
        findings.data["summary"] += f"; {plan.reason}"


class HostMemoryCheck(Check):
    """For CPU training: predicted peak of a training step vs available host RAM."""

    name = "memory.host_ram"
    stage = Stage.MODEL
    codes = ("MEM0", "MEM3", "MEM4", "MEM5", "O11")
    requires = ("data.first_batch",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        try:
            self._judge(ctx, findings)
        except EstimateError as error:  # a model neither traced nor copied: say so, judge nothing
            unestimated(findings, error)

    def _judge(self, ctx: PreflightContext, findings: Findings) -> None:
        if ctx.device.type != "cpu":
            findings.data.update(applicable=False, summary=f"training on {ctx.device}")
            findings.info("MEM0", f"The job trains on {ctx.device}; host RAM is checked for CPU training only.")
            return
        inputs = step_inputs(ctx)
        precision = ctx.training.plan.precision
        estimate = inputs.estimate(inputs.batch_size, device="cpu", precision=precision)
        available = psutil.virtual_memory().available
        held = host_memory_held(ctx)
        limit = host_memory_limit(ctx, available, held)
        if ctx.artifacts.memory_estimate is None:
            ctx.artifacts.memory_estimate = estimate
        findings.data.update(limit=asdict(limit), precision=precision, available_bytes=available, held_bytes=held)
        judge(
            findings,
            what="host",
            estimate=estimate,
            need=estimate.peak_bytes,
            limit=limit,
            inputs=inputs,
            need_for_batch=lambda n: inputs.estimate(n, device="cpu", precision=precision).peak_bytes,
            codes=("MEM4", "MEM5"),
            precision=precision,
        )
        optimizer_step_finding(
            findings, what="host", estimate=estimate, need=estimate.peak_bytes, limit=limit, inputs=inputs,
            need_of=lambda other: other.estimate(other.batch_size, device="cpu", precision=precision).peak_bytes,
            has_fused=optimizer_paths.supports_fused(ctx.optimizer),
        )


def unestimated(findings: Findings, error: EstimateError) -> None:
    findings.data["summary"] = "not estimated"
    findings.info("MEM3", f"the step's memory was not estimated: {error}",
                  "Nothing to do for the run itself; the memory verdict needs a model that copy.deepcopy can copy.")


def memory_checks() -> list[Check]:
    """The memory checks, for the preflight's default check list."""
    return [VRAMHeadroomCheck(), HostMemoryCheck()]
