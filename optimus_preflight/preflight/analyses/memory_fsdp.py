"""The per-rank GPU memory verdict of ``memory.vram_headroom`` for FSDP2 jobs.

Used when the job shards the model: ``trainer.strategy=fsdp`` (or ``auto`` choosing it;
see memory_strategy), over ``preflight.memory.world_size`` ranks ("would it fit on N GPUs
sharded?") or, under torchrun, the run's world size. The estimate is the FSDP2 trace of one rank
(``estimate_fsdp_step``) with the recipe's model, optimizer, loss and first batch, the
run's block classes, resharding and activation checkpointing. When the step does not fit
(or is within 10% of the limit) the check searches the same estimator for the largest
micro-batch that fits at this world size, and, when it does not fit, the smallest power
of two of ranks that fits at this micro-batch (doubling until one fits or more ranks stop
helping, up to 1024) and what activation checkpointing would need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

from optimus_preflight.memory.advice import memory_hints
from optimus_preflight.memory.fsdp_estimate import estimate_fsdp_step
from optimus_preflight.memory.fsdp_result import FSDPMemoryEstimate
from optimus_preflight.memory.result import gib
from optimus_preflight.memory.search import largest_fitting_batch, resize_batch
from optimus_preflight.preflight.analyses.memory_limit import NEAR_LIMIT, MemoryLimit
from optimus_preflight.preflight.analyses.memory_verdict import breakdown_measurements, fallback_finding
from optimus_preflight.preflight.analyses.step_inputs import StepInputs
from optimus_preflight.preflight.framework import Findings

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_WORLD_SIZE = 1024  # the world-size search stops here
WORLD_KEY = "preflight.memory.world_size"


class PerRankEstimator:
    """FSDP2 estimates of one rank for (world size, micro-batch, activation checkpointing),
    each traced once."""

    def __init__(self, ctx: PreflightContext, inputs: StepInputs, precision: str):
        trainer = ctx.cfg.trainer
        fsdp = getattr(trainer, "fsdp", None)
        self.inputs = inputs
        self.precision = precision
        self.block_classes = tuple(getattr(fsdp, "block_classes", None) or ())
        self.reshard_after_forward = bool(getattr(fsdp, "reshard_after_forward", True))
        self.checkpointing = bool(getattr(trainer, "activation_checkpointing", False))
        self.cache: dict[tuple, FSDPMemoryEstimate] = {}

    def estimate(self, world_size: int, micro_batch: int, checkpointing: bool | None = None,
                 inputs: StepInputs | None = None) -> FSDPMemoryEstimate:
        inputs = inputs or self.inputs
        checkpointing = self.checkpointing if checkpointing is None else checkpointing
        key = (world_size, micro_batch, checkpointing, inputs.build_optimizer)
        if key not in self.cache:
            self.cache[key] = estimate_fsdp_step(
                inputs.model_fn, resize_batch(inputs.batch, micro_batch, inputs.batch_size), inputs.loss_fn,
                inputs.build_optimizer, world_size=world_size, precision=self.precision, device="cuda",
                accumulation_steps=inputs.accumulation_steps, block_classes=self.block_classes,
                activation_checkpointing=checkpointing, reshard_after_forward=self.reshard_after_forward,
            )
        return self.cache[key]

    def need(self, world_size: int, micro_batch: int, checkpointing: bool | None = None) -> int:
        return need_bytes(self.estimate(world_size, micro_batch, checkpointing))


def need_bytes(estimate: FSDPMemoryEstimate) -> int:
    """What must fit besides the CUDA context (counted in the limit): peak, unsplit blocks, workspaces."""
    return estimate.required_bytes - estimate.context_bytes


def smallest_world_size(need_at: Callable[[int], int], limit: int, start: int,
                        upper: int = MAX_WORLD_SIZE) -> tuple[int | None, dict[int, int]]:
    """The smallest power of two above ``start`` (up to ``upper``) whose need fits ``limit``,
    doubling the ranks until one fits or the need stops shrinking (what is left is the
    activations and the gathered blocks, which more ranks do not divide; padding to a
    multiple of the ranks even grows them), and the needs probed. None: none fits."""
    probes: dict[int, int] = {}
    previous = None
    n = 1
    while n <= start:
        n *= 2
    while n <= upper:
        probes[n] = need_at(n)
        if probes[n] <= limit:
            return n, probes
        if previous is not None and probes[n] >= previous:
            break
        previous = probes[n]
        n *= 2
    return None, probes


def check_per_rank(ctx: PreflightContext, findings: Findings, limit: MemoryLimit, inputs: StepInputs,
                   precision: str, world_size: int) -> FSDPMemoryEstimate:
    """Judge one rank of ``world_size`` against ``limit``; returns the estimate at the run's micro-batch."""
    notes = []
    if precision == "fp16":  # trainer.strategy=fsdp refuses fp16 (a GradScaler cannot agree across shards)
        precision = "bf16"
        notes.append("estimated in bf16: FSDP does not support fp16 (trainer.precision)")
    estimator = PerRankEstimator(ctx, inputs, precision)
    batch_size = inputs.batch_size
    estimate = estimator.estimate(world_size, batch_size)
    need = need_bytes(estimate)
    what = f"one rank of {world_size} (FSDP2{', activation checkpointing' if estimator.checkpointing else ''})"
    findings.data.update(
        per_rank=True, world_size=world_size, strategy="fsdp", need_bytes=need, limit_bytes=limit.bytes,
        limit=asdict(limit), precision=precision, activation_checkpointing=estimator.checkpointing,
        utilization=round(need / limit.bytes, 4) if limit.bytes > 0 else None, estimate=estimate.to_dict(),
        summary=f"{what} needs {gib(need)} of {gib(limit.bytes)} usable GPU memory ({estimate.method} estimate)",
        **breakdown_measurements(estimate),
    )
    fallback_finding(findings, what="per-rank FSDP", estimate=estimate, need=need, limit=limit,
                     fix="Avoid data-dependent ops (.item(), boolean masks, nonzero) in the model and loss.",
                     detail=f": {'; '.join(estimate.notes)}" if estimate.notes else "")
    if need <= NEAR_LIMIT * limit.bytes:
        return estimate
    fits = need <= limit.bytes
    search = largest_fitting_batch(lambda n: estimator.need(world_size, n), limit.bytes, batch_size,
                                   current_need=need, upper=2 * batch_size if fits else batch_size)
    findings.data["largest_micro_batch"] = search.largest
    findings.data["search_probes"] = {str(n): v for n, v in sorted(search.probes.items())}
    at = f"At {world_size} rank{'s' if world_size > 1 else ''}"
    if search.largest == 0:
        batch_text = f"{at} not even a micro-batch of 1 fits."
    else:
        batch_text = (f"{at} the largest micro-batch predicted to fit is {search.largest}"
                      f"{' or more' if search.at_least else ''} (data.batch_size={batch_size} now).")
    sentences, fixes = [batch_text], []
    if not fits:
        smallest, probes = smallest_world_size(lambda n: estimator.need(n, batch_size), limit.bytes, world_size)
        findings.data["smallest_world_size"] = smallest
        findings.data["world_size_probes"] = {str(n): v for n, v in sorted(probes.items())}
        if smallest is not None:
            sentences.append(f"The smallest world size that fits data.batch_size={batch_size} is {smallest} "
                             f"(one rank of {smallest} needs {gib(probes[smallest])}).")
            fixes.append(f"Shard over more GPUs: {WORLD_KEY}={smallest} (and launch that many ranks).")
        else:
            most = max(probes, default=None)
            sentences.append(f"No world size fits data.batch_size={batch_size}"
                             + (f": one rank of {most} still needs {gib(probes[most])}, and more ranks do not "
                                "shrink the activations and the gathered blocks." if most else "."))
        if not estimator.checkpointing:
            with_ac = estimator.estimate(world_size, batch_size, checkpointing=True)
            if with_ac.method == "fake" and need_bytes(with_ac) < need:  # not traced: no blocks to checkpoint
                findings.data["need_bytes_activation_checkpointing"] = need_bytes(with_ac)
                verdict = "fits" if need_bytes(with_ac) <= limit.bytes else "still over"
                sentences.append(f"With activation checkpointing one rank needs {gib(need_bytes(with_ac))} ({verdict}).")
                fixes.append("Set trainer.activation_checkpointing=true (recompute each block's activations in backward).")
    hints = memory_hints(estimate.breakdown, precision=precision, batch_size=batch_size, largest_batch=search.largest,
                         accumulation_steps=inputs.accumulation_steps, peak_at=estimate.peak_at)
    fix = " ".join(fixes + [h for h in hints if "activation checkpointing" not in h or not fixes]) or "Reduce data.batch_size."
    message = (f"{what[0].upper()}{what[1:]} needs {gib(need)} of GPU memory ({estimate.describe(overheads=False)}; "
               f"+ {gib(estimate.workspace_bytes)} cuBLAS workspaces){''.join('; ' + n for n in notes)}; "
               f"{limit.description}. " + " ".join(sentences))
    if not fits:
        findings.error("MEM1", "Will not fit: " + message, fix, WORLD_KEY if findings.data.get("smallest_world_size")
                       and search.largest == 0 else "data.batch_size")
    else:
        findings.warning("MEM2", f"Within {1 - NEAR_LIMIT:.0%} of the limit: " + message, fix, "data.batch_size")
    return estimate


def per_rank_need_of(ctx: PreflightContext, inputs: StepInputs, precision: str, world_size: int) -> Callable[[StepInputs], int]:
    """``need_of`` for the O11 finding: the per-rank need of the step ``other`` inputs build."""
    estimator = PerRankEstimator(ctx, inputs, "bf16" if precision == "fp16" else precision)

    def need_of(other: StepInputs) -> int:
        return need_bytes(estimator.estimate(world_size, other.batch_size, inputs=other))

    return need_of

