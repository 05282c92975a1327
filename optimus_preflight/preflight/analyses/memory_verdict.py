"""The memory checks' verdicts on an estimate: over the limit (error) or within 10% of it
(warning), with the largest micro-batch that fits (MEM1/MEM2, MEM4/MEM5, MEM3 for the
formula fallback), and a peak made of foreach's optimizer temporaries (O11), re-estimated
with ``foreach=False`` and ``fused=True`` to say what each would need."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from optimus_preflight.memory import optimizer_paths
from optimus_preflight.memory.advice import memory_hints
from optimus_preflight.memory.result import MemoryEstimate, gib
from optimus_preflight.memory.search import largest_fitting_batch
from optimus_preflight.preflight.analyses.memory_limit import NEAR_LIMIT, MemoryLimit
from optimus_preflight.preflight.analyses.step_inputs import StepInputs
from optimus_preflight.preflight.framework import Findings


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
    who: str = "step",
) -> None:
    """Error above the limit, warning above 90% of it; either way say what fits.
    ``who``: what needs the memory (``one rank of 8 (DDP: a full replica)``)."""
    findings.data.update(
        need_bytes=need,
        limit_bytes=limit.bytes,
        utilization=round(need / limit.bytes, 4) if limit.bytes > 0 else None,
        estimate=estimate.to_dict(),
        summary=f"{who} needs {gib(need)} of {gib(limit.bytes)} usable {what} memory ({estimate.method} estimate)",
        **breakdown_measurements(estimate),
    )
    fallback_finding(findings, what=what, estimate=estimate, need=need, limit=limit,
                     fix="Avoid data-dependent ops (.item(), boolean masks, nonzero) in the model and loss, "
                         "or measure the step on the GPU with optimus_preflight.memory.check_gpu_step.")
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
    subject = "The training step" if who == "step" else who[0].upper() + who[1:]
    message = (
        f"{subject} needs {gib(need)} of {what} memory ({estimate.describe(overheads=False)}{extra}); "
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


def breakdown_measurements(estimate: MemoryEstimate) -> dict[str, int]:
    """The estimate's composition at the peak, as plain measurements of the check (bytes)."""
    parts = estimate.breakdown
    return {
        "parameters_bytes": int(parts.get("params", 0)),
        "gradients_bytes": int(parts.get("grads", 0)),
        "optimizer_state_bytes": int(parts.get("optimizer_state", 0)),
        "activations_bytes": int(parts.get("activations", 0)),
        "other_bytes": int(parts.get("other", 0)),
        "peak_bytes": int(estimate.peak_bytes),
    }


def fallback_finding(findings: Findings, *, what: str, estimate: MemoryEstimate, need: int, limit: MemoryLimit,
                     fix: str, detail: str = "") -> None:
    """MEM3 when the step could not be traced and the formula stood in. The formula is a
    lower bound, which only matters near the limit: there it is a warning (the real peak
    may be over); far below the limit the step fits anyway, and a note says which ops kept
    the trace from running (e.g. pack_padded_sequence's data-dependent lengths)."""
    if estimate.method == "fake":
        return
    text = (f"The {what} memory estimate could not trace the step and used the formula fallback "
            f"(a lower bound{detail}): {estimate.reason}")
    if need > NEAR_LIMIT * limit.bytes:
        findings.warning("MEM3", text, fix)
    else:
        findings.info("MEM3", f"{text.rstrip('.')}. The formula's {gib(need)} is far below the {gib(limit.bytes)} usable, "
                              "so the step fits even with a margin for what it misses.", fix)


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
