"""Nominal class ids trained as a regression target (``step.regressed_classes``).

``TARGET_NOMINAL_REGRESSED``: a model with one output per sample trained with a regression
criterion (``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``) on targets that hold
a few whole numbers, where those numbers are ids of unordered classes. The loss falls, the
rounded predictions land between classes. Whether the numbers are ordered (ratings, counts,
which regress well) or nominal is read from the inputs (``analyses.class_numbering``): ordinal
classes follow one direction of the inputs, nominal ones several.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.class_numbering import class_numbering
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
SAMPLES = 1024
BUDGET_S = 2.0
MAX_READ = 4096  # values per sample kept (strided)


def _pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs (B, D) float, targets (B,)) of an (x, y) batch with one target per sample."""
    found = inputs_beside_labels(batch)
    if found is None:
        return None
    inputs, targets = found
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor) or not inputs.is_floating_point() \
            or inputs.dim() < 2 or targets.numel() != len(inputs) or targets.dtype == torch.bool:
        return None
    flat = inputs.detach().reshape(len(inputs), -1)
    if flat.shape[1] > MAX_READ:
        flat = flat[:, ::-(-flat.shape[1] // MAX_READ)]
    return flat.float().cpu(), targets.detach().reshape(-1).double().cpu()


class RegressedClassesCheck(Check):
    """TARGET_NOMINAL_REGRESSED: unordered class ids regressed by one output."""

    name = "step.regressed_classes"
    stage = Stage.STEP
    codes = ("TARGET_NOMINAL_REGRESSED",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no whole-number targets regressed by one output"
        if getattr(getattr(ctx.model, "config", None), "num_labels", None) == 1:
            return  # step.targets names Hugging Face's num_labels=1 itself
        call = next((c for c in get_probe(ctx).criterion_calls if c.function in REGRESSION and c.target is not None
                     and len(c.input.shape) >= 1 and (len(c.input.shape) == 1 or c.input.shape[1:] == (1,))
                     and (not c.target.is_floating or c.target.whole)), None)
        if call is None or _pair(ctx.artifacts.first_batch) is None:
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, f"training samples for {self.name}", _pair,
                             SAMPLES, BUDGET_S)
        if not parts or len({p[0].shape[1] for p in parts}) != 1:
            return
        found = class_numbering(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        if found is None:
            return
        directions = ", ".join(f"{d:.2f}" for d in found.directions[:3])
        findings.data.update(classes=found.classes, directions=[round(d, 3) for d in found.directions],
                             probe_accuracy=round(found.accuracy, 3), ids_r2=round(found.ids_r2, 3))
        findings.data["summary"] = (f"{len(found.classes)} whole-number targets; class directions {directions}")
        if not found.nominal:
            return
        values = ", ".join(f"{v:g}" for v in found.classes)
        findings.warning(
            "TARGET_NOMINAL_REGRESSED",
            f"{call.function} trains one output per sample on targets that hold {len(found.classes)} whole numbers "
            f"({values}): class ids regressed as numbers. Ordered targets (ratings, counts, grades) follow one "
            f"direction of the inputs; these classes differ along several (a linear probe tells them apart "
            f"{found.accuracy:.0%} of the time, with explained variance {directions} along its best independent "
            "scorings, where ordered classes have one large value and the rest near 0). They are categories, not "
            "quantities: the single output is pulled towards the average id of neighbouring classes and its rounded "
            "predictions land on classes between them",
            f"Make it a classifier: one output per class (nn.Linear(hidden, {len(found.classes)})) trained with "
            "nn.CrossEntropyLoss on the ids as integers (y.long(), shifted to start at 0), predicting "
            "logits.argmax(1); keep a single regressed output only for targets whose order means something.",
            "model",
        )
