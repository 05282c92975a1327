"""A feature the model hands back untouched (``step.passthrough``).

``OUTPUT_PASSES_INPUT``: a model whose output has the input's shape (a normalising flow,
an autoencoder, a denoiser) and returns some input columns exactly as they came in, while
it changes the others. In a coupling flow that is a mask that never alternates: every
layer conditions on the same half and transforms the other, so the kept coordinates are
never modelled (their density stays the base distribution's, whatever the data); an
autoencoder or denoiser that copies columns learns nothing about them.

Read from one eval-mode forward on the first batch: the model's first output tensor of the
input's ``(B, D)`` shape (or a tuple's), compared column by column with the input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.analyses.eval_forward import model_outputs
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8


def passed_columns(inputs: torch.Tensor, output: torch.Tensor) -> list[int] | None:
    """The columns the output returns exactly as the input had them, when it changes others (pure)."""
    if inputs.shape != output.shape or inputs.dim() != 2 or inputs.shape[0] < MIN_ROWS or inputs.shape[1] < 2:
        return None
    same = (inputs.float() == output.float()).all(0)
    if bool(same.all()) or not bool(same.any()):
        return None
    varying = inputs.float().std(0) > 0
    columns = [int(c) for c in torch.nonzero(same & varying).flatten()]
    return columns or None


class PassthroughCheck(Check):
    """OUTPUT_PASSES_INPUT: input columns returned untouched by a model that changes the rest."""

    name = "step.passthrough"
    stage = Stage.STEP
    codes = ("OUTPUT_PASSES_INPUT",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no output of the input's shape"
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        inputs = [t for t in leaves(batch) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 2]
        if not inputs:
            return
        outputs = model_outputs(ctx, batch)
        if not outputs:
            return
        for output in outputs:
            columns = passed_columns(inputs[0], output)
            if columns is None:
                continue
            shown = ", ".join(str(c) for c in columns[:6]) + (" ..." if len(columns) > 6 else "")
            findings.data["summary"] = f"{len(columns)} of {inputs[0].shape[1]} input columns returned untouched"
            findings.warning(
                "OUTPUT_PASSES_INPUT",
                f"the model returns input column(s) {shown} of its {tuple(inputs[0].shape)} input exactly as they came "
                f"in, in its {tuple(output.shape)} output, while it transforms the other {inputs[0].shape[1] - len(columns)}: "
                "those features pass through every layer untouched and are never modelled. In a coupling flow "
                "(RealNVP, Glow) every layer then uses the same mask: the conditioning half is never transformed, so "
                "its density stays the base distribution's",
                "Alternate the coupling masks between layers (mask, 1 - mask, ...) or permute/reverse the features "
                "between couplings, so every coordinate is transformed by some layer.",
            )
            return
