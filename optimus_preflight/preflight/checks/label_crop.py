"""Frame targets cropped to a strided model's output length (``step.label_crop``).

``LABELS_CROPPED_TO_OUTPUT``: a model whose front end downsamples time by ``r`` (a stride-4
convolution, pooling) outputs ``T / r`` frames for ``T`` input frames; its frame labels must be
brought to that rate (``labels[:, ::r]``, or pooled over each stride). Cut to the output's
length instead (``labels[:, :T // r]``), output frame ``j`` is trained on the label of input
frame ``j``, the first ``1 / r`` of the clip: every event lands at the wrong time.

Read from one eval-mode loss call: a criterion whose target is a view of a batch field that
keeps the field's strides and offset (a prefix, not a strided read) and is exactly ``r`` times
shorter along one axis (``r`` of 2 to 8), beside an input of the target's shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.loss_spy import BINARY_CRITERIA, CLASS_CRITERIA, REGRESSION_CRITERIA
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

CRITERIA = {*CLASS_CRITERIA, *BINARY_CRITERIA, *REGRESSION_CRITERIA}
RATES = range(2, 9)
MIN_FRAMES = 8  # of the cropped target


class CropWatch(TorchFunctionMode):
    """Criterion targets that are a prefix of a batch field along one axis."""

    def __init__(self, fields: list[torch.Tensor]) -> None:
        super().__init__()
        self.fields = fields
        self.found: tuple[str, int, int, int] | None = None  # (criterion, axis, kept, whole)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in CRITERIA and self.found is None and len(args) >= 2:
            inputs, target = args[0], args[1]
            if isinstance(inputs, torch.Tensor) and isinstance(target, torch.Tensor) and target.dim() >= 2:
                self.found = _cropped(name, inputs, target, self.fields)
        return func(*args, **kwargs)


def _cropped(name: str, inputs: torch.Tensor, target: torch.Tensor,
             fields: list[torch.Tensor]) -> tuple[str, int, int, int] | None:
    for field in fields:
        if field.dim() != target.dim() or field.shape[0] != target.shape[0] or field.layout != torch.strided \
                or target.untyped_storage().data_ptr() != field.untyped_storage().data_ptr() \
                or target.stride() != field.stride() or target.storage_offset() != field.storage_offset():
            continue
        differing = [axis for axis in range(1, field.dim()) if field.shape[axis] != target.shape[axis]]
        if len(differing) != 1:
            continue
        axis = differing[0]
        kept, whole = target.shape[axis], field.shape[axis]
        if kept >= MIN_FRAMES and any(kept * rate == whole for rate in RATES) and inputs.shape[axis] == kept:
            return name, axis, kept, whole
    return None


class LabelCropCheck(Check):
    """LABELS_CROPPED_TO_OUTPUT: frame labels cut to a downsampled output's length instead of resampled."""

    name = "step.label_crop"
    stage = Stage.STEP
    codes = ("LABELS_CROPPED_TO_OUTPUT",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "no target cut from a batch field"
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        fields = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2]
        if not fields:
            return
        watch = CropWatch(fields)
        try:
            with watch:
                eval_forward(ctx, batch)  # already on the device: the loss receives these very tensors
        except Exception:
            return
        if watch.found is None:
            return
        criterion, axis, kept, whole = watch.found
        rate = whole // kept
        index = ", ".join([":"] * axis + [f":{kept}"])
        strided = ", ".join([":"] * axis + [f"::{rate}"])
        findings.data["summary"] = f"target = labels[{index}] of {whole} frames"
        findings.warning(
            "LABELS_CROPPED_TO_OUTPUT",
            f"{criterion}'s target is the first {kept} of the batch labels' {whole} frames (labels[{index}], dim "
            f"{axis}), beside a model output of {kept} frames: the model downsamples time {rate}x, so its output "
            f"frame j covers input frames {rate}j..{rate}j+{rate - 1}, while the cropped target gives it the label of "
            f"input frame j. Every event is trained {rate}x too early and the last {whole - kept} frames' labels are "
            "never used",
            f"Bring the labels to the output's rate: labels[{strided}] (or pool each stride: "
            f"labels.unfold({axis}, {rate}, {rate}).amax(-1) for event presence), not a crop to the output's length.",
        )
