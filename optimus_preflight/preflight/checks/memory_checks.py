"""Preflight checks: will the training step fit the GPU (local or a target size) and host RAM?

Each check estimates two real training steps on fake tensors (the recipe's model,
optimizer, loss and first batch, the configured precision and accumulation); the GPU
check estimates one rank of an FSDP2 job instead when ``preflight.memory.world_size`` is
set or the run shards with ``trainer.strategy=fsdp`` (memory_fsdp). Each compares
the peak with the usable memory and, when it does not fit or is within 10% of the
limit, searches the estimator for the largest micro-batch that fits.

Issue codes: MEM0 not applicable (info), MEM1/MEM2 GPU memory exceeded/within 10%,
MEM3 the estimate fell back to the formula, MEM4/MEM5 host RAM exceeded/within 10%,
MEM6 preflight.memory.target_gib too small to hold even the CUDA context, O11 a step whose
peak is foreach's optimizer temporaries (the step re-estimated with ``foreach=False`` and,
where the optimizer has it, ``fused=True``, to say what each would need).
Artifacts left for later consumers: ``memory.estimate`` (the ``MemoryEstimate``) and
``memory.largest_micro_batch`` (for the OOM observer's hint).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import psutil
import torch

from optimus_preflight.memory import cuda_rules, optimizer_paths
from optimus_preflight.memory.advice import memory_hints
from optimus_preflight.memory.result import GIB, MemoryEstimate, gib
from optimus_preflight.memory.search import largest_fitting_batch
from optimus_preflight.preflight.checks.memory_fsdp import check_per_rank, fsdp_world_size, per_rank_need_of
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.sizes import local_storage
from optimus_preflight.preflight.step_inputs import StepInputs, step_inputs
from optimus_preflight.training.distributed import unwrap

if TYPE_CHECKING:
    from optimus_preflight.preflight.preflight_context import PreflightContext

NEAR_LIMIT = 0.9  # warn when the need is above this share of the limit


@dataclass
class MemoryLimit:
    bytes: int
    description: str
    key: str


def gpu_memory_limit(cfg: Any, device: torch.device) -> MemoryLimit | None:
    """Usable GPU bytes for tensors: the configured target, else the local GPU, else None."""
    memory = cfg.preflight.memory
    fraction, reserve = float(memory.usable_fraction), float(memory.reserve_gib) * GIB
    context = cuda_rules.CUDA_CONTEXT_BYTES
    if memory.target_gib is not None:
        total = float(memory.target_gib) * GIB
        usable = min(fraction * total, total - reserve) - context
        return MemoryLimit(
            int(usable),
            f"a {memory.target_gib:g} GiB GPU (preflight.memory.target_gib) leaves {gib(usable)} for tensors "
            f"= min({fraction:.0%} of it, it - {memory.reserve_gib:g} GiB reserve) - {gib(context)} CUDA context",
            "preflight.memory.target_gib",
        )
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    free, _ = torch.cuda.mem_get_info(device)
    # What this process already holds (the model, the optimizer) is in use, not lost.
    held = torch.cuda.memory_reserved(device)
    usable = min(fraction * total - context, free + held - reserve)
    return MemoryLimit(
        int(usable),
        f"{torch.cuda.get_device_name(device)} leaves {gib(usable)} for tensors = min({fraction:.0%} of "
        f"{gib(total)} - {gib(context)} CUDA context, {gib(free)} free + {gib(held)} held by this process "
        f"- {memory.reserve_gib:g} GiB reserve)",
        "preflight.memory.usable_fraction",
    )


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


def gpu_precision(ctx: PreflightContext) -> str:
    """The precision the job will use on the GPU, also when checked from a CPU machine."""
    if ctx.device.type == "cuda":
        return ctx.training.plan.precision
    requested = str(ctx.cfg.trainer.precision)
    # auto picks bf16 on a GPU that supports it (every GPU worth a target check does).
    return "bf16" if requested == "auto" else requested


def ddp_bucket_bytes(ctx: PreflightContext) -> int:
    """DDP's gradient buckets copy every trainable gradient (gradient_as_bucket_view=False)."""
    if not ctx.training.dist.is_distributed:
        return 0
    model = unwrap(ctx.model)
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def judge(
    findings: Findings,
    *,
    what: str,
    estimate: MemoryEstimate,
    need: int,
    limit: MemoryLimit,
    inputs: StepInputs,
    need_for_batch: Any,
    codes: tuple[str, str],
    precision: str,
    extra: str = "",
) -> None:
    """Error above the limit, warning above 90% of it; either way say what fits."""
    findings.data.update(
        need_bytes=need,
        limit_bytes=limit.bytes,
        utilization=round(need / limit.bytes, 4) if limit.bytes > 0 else None,
        estimate=estimate.to_dict(),
        summary=f"step needs {gib(need)} of {gib(limit.bytes)} usable {what} memory ({estimate.method} estimate)",
    )
    if estimate.method != "fake":
        findings.warning(
            "MEM3",
            f"The {what} memory estimate could not trace the step and used the formula fallback "
            f"(a lower bound): {estimate.reason}",
            "Avoid data-dependent ops (.item(), boolean masks, nonzero) in the model and loss, "
            "or measure the step on the GPU with optimus_preflight.memory.check_gpu_step.",
        )
    if need <= NEAR_LIMIT * limit.bytes:
        return
    batch_size = inputs.batch_size
    fits = need <= limit.bytes
    search = largest_fitting_batch(
        need_for_batch,
        limit.bytes,
        batch_size,
        current_need=need,
        upper=2 * batch_size if fits else batch_size,
    )
    findings.data["largest_micro_batch"] = search.largest
    findings.data["search_probes"] = {str(n): v for n, v in sorted(search.probes.items())}
    if search.largest == 0:
        fit_text = "Not even a micro-batch of 1 fits."
    else:
        fit_text = f"The largest micro-batch predicted to fit is {search.largest}{' or more' if search.at_least else ''} (data.batch_size={batch_size} now)."
    message = (
        f"The training step needs {gib(need)} of {what} memory ({estimate.describe(overheads=False)}{extra}); "
        f"{limit.description}. {fit_text}"
    )
    hints = memory_hints(
        estimate.breakdown,
        precision=precision,
        batch_size=batch_size,
        largest_batch=search.largest,
        accumulation_steps=inputs.accumulation_steps,
        peak_at=estimate.peak_at,
    )
    fix = " ".join(hints) or "Reduce data.batch_size."
    if not fits:
        findings.error(codes[0], "Will not fit: " + message, fix, "data.batch_size")
    else:
        findings.warning(codes[1], f"Within {1 - NEAR_LIMIT:.0%} of the limit: " + message, fix, "data.batch_size")


# Below these the foreach temporaries are not worth a line: their share of the peak, and
# what the per-tensor loop saves, as shares of the need.
TEMPORARIES_SHARE = 0.05
WORTH_SAVING = 0.02


def optimizer_step_finding(
    findings: Findings,
    *,
    what: str,
    estimate: MemoryEstimate,
    need: int,
    limit: MemoryLimit,
    inputs: StepInputs,
    need_of: Callable[[StepInputs], int],
    has_fused: bool,
) -> None:
    """O11: when the step is over or near the limit and its peak is inside a foreach
    ``optimizer.step()``, whose temporaries span every parameter at once, re-estimate it
    with the per-tensor loop (and fused, where the optimizer has it) and say what each needs.
    ``need_of(inputs)`` is the need of the step those inputs build, as ``need`` was measured;
    ``has_fused``: the job's optimizer class has a fused implementation."""
    temporaries = estimate.detail.get("optimizer_temporaries", 0)
    findings.data.update(optimizer_step=estimate.optimizer_step, optimizer_temporaries_bytes=temporaries)
    if (
        estimate.method != "fake"
        or estimate.optimizer_step not in (optimizer_paths.FOREACH, optimizer_paths.MIXED)
        or "optimizer.step" not in estimate.peak_at
        or need <= NEAR_LIMIT * limit.bytes
        or temporaries <= 0
        or temporaries < TEMPORARIES_SHARE * estimate.peak_bytes
    ):
        return
    loop_need = need_of(replace(inputs, build_optimizer=optimizer_paths.per_tensor(inputs.build_optimizer)))
    findings.data["need_bytes_foreach_false"] = loop_need
    if need - loop_need < WORTH_SAVING * need:
        return
    fused_inputs = replace(inputs, build_optimizer=optimizer_paths.fused(inputs.build_optimizer))
    fused_need = need_of(fused_inputs) if has_fused else None
    findings.data["need_bytes_fused"] = fused_need

    def verdict(nbytes: int) -> str:
        return f"{gib(nbytes)}, {'fits' if nbytes <= limit.bytes else 'still over'} the {gib(limit.bytes)} usable"

    default = " (the default on CUDA when neither foreach nor fused is given)" if estimate.device == "cuda" else ""
    message = (
        f"The {what} memory peak is inside optimizer.step(): its foreach implementation{default} allocates "
        f"temporaries for all parameters of a group at once, {gib(temporaries)} at the peak "
        f"({temporaries / estimate.peak_bytes:.0%} of it). With foreach=False the step needs {verdict(loop_need)}"
        + (f"; with fused=True {verdict(fused_need)}" if fused_need is not None else "")
        + "."
    )
    switch = "foreach=False" if loop_need <= limit.bytes else "fused=True" if fused_need and fused_need <= limit.bytes else None
    if switch:
        # The size advice of MEM1/MEM4 assumed the optimizer as built; the cheaper fix comes first.
        for issue in findings.issues:
            if issue.code.startswith("MEM"):
                issue.fix = f"Pass {switch} to the optimizer and the step fits as it is (O11). {issue.fix}"
    fused_fix = " or ++optimizer.fused=true (one kernel per group, no temporaries, the fastest)" if fused_need else ""
    findings.warning(
        "O11",
        message,
        f"Set ++optimizer.foreach=false (the per-tensor loop: a slower step, temporaries of one parameter at a "
        f"time){fused_fix}.",
        "optimizer.foreach",
        code_fix="In your build_optimizer, pass foreach=False to the optimizer"
                 + (" (or fused=True)" if fused_need else "") + ".",
    )


class VRAMHeadroomCheck(Check):
    """Predicted peak of a training step vs the usable memory of the GPU it will run on."""

    name = "memory.vram_headroom"
    stage = Stage.MODEL
    requires = ("data.first_batch",)
    needs_weights = False  # fake tensors: the verdict for a model kept on the meta device

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
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
        world_size = fsdp_world_size(ctx)
        if world_size is not None:  # one rank of an FSDP2 job (memory_fsdp)
            estimate = check_per_rank(ctx, findings, limit, inputs, precision, world_size)
            ctx.artifacts["memory.estimate"] = estimate
            ctx.artifacts["memory.largest_micro_batch"] = findings.data.get("largest_micro_batch")
            optimizer_step_finding(findings, what="GPU", estimate=estimate, need=findings.data["need_bytes"],
                                   limit=limit, inputs=inputs,
                                   need_of=per_rank_need_of(ctx, inputs, precision, world_size),
                                   has_fused=optimizer_paths.supports_fused(ctx.optimizer))
            return
        ddp = ddp_bucket_bytes(ctx)

        def need_for_batch(micro_batch: int) -> int:
            estimate = inputs.estimate(micro_batch, device="cuda", precision=precision)
            return estimate.required_bytes - estimate.context_bytes + ddp

        estimate = inputs.estimate(inputs.batch_size, device="cuda", precision=precision)
        need = estimate.required_bytes - estimate.context_bytes + ddp
        ctx.artifacts["memory.estimate"] = estimate
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
        )
        ctx.artifacts["memory.largest_micro_batch"] = findings.data.get("largest_micro_batch")

        def need_of(other: StepInputs) -> int:
            other_estimate = other.estimate(other.batch_size, device="cuda", precision=precision)
            return other_estimate.required_bytes - other_estimate.context_bytes + ddp

        optimizer_step_finding(findings, what="GPU", estimate=estimate, need=need, limit=limit, inputs=inputs,
                               need_of=need_of, has_fused=optimizer_paths.supports_fused(ctx.optimizer))


def host_memory_held(ctx: PreflightContext) -> int:
    """Bytes the live model and optimizer already hold in RAM (counted in the estimate too)."""
    seen: set[int] = set()
    total = 0
    model = unwrap(ctx.model)
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [v for state in ctx.optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    for tensor in tensors:
        if tensor.device.type != "cpu":
            continue
        storage = local_storage(tensor)
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


class HostMemoryCheck(Check):
    """For CPU training: predicted peak of a training step vs available host RAM."""

    name = "memory.host_ram"
    stage = Stage.MODEL
    requires = ("data.first_batch",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if ctx.device.type != "cpu":
            findings.data.update(applicable=False, summary=f"training on {ctx.device}")
            findings.info("MEM0", f"The job trains on {ctx.device}; host RAM is checked for CPU training only.")
            return
        inputs = step_inputs(ctx)
        precision = ctx.training.plan.precision
        estimate = inputs.estimate(inputs.batch_size, device="cpu", precision=precision)
        available = psutil.virtual_memory().available
        held = host_memory_held(ctx)
        reserve = float(ctx.cfg.preflight.memory.reserve_gib) * GIB
        limit = MemoryLimit(
            int(available + held - reserve),
            f"this machine has {gib(available)} of RAM available + {gib(held)} already held by the model "
            f"and optimizer, less the {ctx.cfg.preflight.memory.reserve_gib:g} GiB reserve "
            f"(preflight.memory.reserve_gib)",
            "preflight.memory.reserve_gib",
        )
        ctx.artifacts.setdefault("memory.estimate", estimate)
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


def memory_checks() -> list[Check]:
    """The memory checks, for the preflight's default check list."""
    return [VRAMHeadroomCheck(), HostMemoryCheck()]
