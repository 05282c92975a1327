"""Class imbalance corrected twice (``step.double_balancing``).

A ``WeightedRandomSampler`` with weights ``1 / count[label]`` already draws every class about
equally often; a criterion weighted by ``1 / count`` as well (``CrossEntropyLoss(weight=...)``,
``BCEWithLogitsLoss(pos_weight=neg / pos)``) then multiplies the rare classes' share again, so
they end up weighted by the imbalance ratio itself: the model over-predicts them (precision
collapses) instead of seeing a balanced problem. Read from the first step: the loader's sampler,
the criterion's class weights, and the batch's class counts (about equal: the sampler balanced
them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.utils.data import WeightedRandomSampler

from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.batch_checks import sampler_chain
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


class DoubleBalancingCheck(Check):
    """LOSS_WEIGHTS_ON_BALANCED_SAMPLER: a balancing sampler and balancing class weights together."""

    name = "step.double_balancing"
    stage = Stage.STEP
    codes = ("LOSS_WEIGHTS_ON_BALANCED_SAMPLER",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no WeightedRandomSampler"
        if not hasattr(ctx.train_loader, "sampler") or not any(
                isinstance(item, WeightedRandomSampler) for item in sampler_chain(ctx.train_loader)):
            return
        found = next((call.balanced_twice for call in get_probe(ctx).criterion_calls if call.balanced_twice), None)
        findings.data["summary"] = "class weights and a balanced batch" if found else "no unequal class weights"
        if found is None:
            return
        what = "pos_weight" if found.function == "binary_cross_entropy_with_logits" else "weight"
        findings.warning(
            "LOSS_WEIGHTS_ON_BALANCED_SAMPLER",
            f"the classes are balanced twice: the training loader's WeightedRandomSampler already draws them about "
            f"equally (the first batch holds "
            f"{found.counts}), and {found.function}'s {what} weights them again, {found.spread:.1f}x apart: the "
            "imbalance is corrected twice, so the rare classes end up weighted by about the imbalance ratio "
            "itself and the model over-predicts them (precision on them collapses)",
            f"Balance once: keep the WeightedRandomSampler and drop the criterion's {what} (or keep the {what} and "
            "draw with shuffle=True).",
        )
