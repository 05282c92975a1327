"""A loss that reads one sequence position, padding in most rows (``step.loss_positions``).

``LOSS_READS_PADDING``: a language model or sequence classifier whose loss takes the output at
one fixed column of every row (``logits[:, -2]`` against ``labels[:, -1]``, a classifier's habit
carried to a causal LM; ``h[:, -1]`` of a right-padded batch): in a right-padded batch that
column is padding for every row shorter than the longest, so the loss never sees a real
token's prediction for most rows, or learns to predict the padding.

Read from the gradient, not the code: on the first batch the model's ``(B, T, ...)`` output
(a tensor, or a Hugging Face output's ``logits``) is swapped for a free tensor and the loss's
gradient with respect to it says which positions the loss reads. When every row's gradient
sits in one and the same column, and that column is padding (per the batch's attention mask,
or the trailing run of the pad id in its token ids) in most rows, the finding fires. A loss
over every position, a read-out at each row's last real token (``lengths - 1``), a first
``[CLS]`` column and left padding read real tokens and stay quiet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.answer_spans import before_trailing_padding
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8
PADDED_SHARE = 0.5  # of the rows whose one read column is padding


def token_positions(batch: Any) -> torch.Tensor | None:
    """The (B, T) real positions of a token batch: its attention mask, or the ids before the
    trailing run of the id that ends the shorter rows."""
    if isinstance(batch, Mapping):
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            return mask != 0
        ids = batch.get("input_ids")
    else:
        ids = next((leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() == 2
                    and not leaf.is_floating_point() and leaf.dtype != torch.bool), None)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    return before_trailing_padding(ids)


def read_columns(ctx: PreflightContext, batch: Any, steps: int) -> torch.Tensor | None:
    """(B, T) bool: where the loss's gradient reaches the model's (B, T, ...) output; None when
    the output has no such axis or the loss does not depend on it through autograd."""
    free: list[torch.Tensor] = []

    def swap(module: nn.Module, args: Any, output: Any) -> Any:
        if free:
            return output
        logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
        if not isinstance(logits, torch.Tensor) or logits.dim() < 3 or logits.shape[1] != steps \
                or not logits.is_floating_point():
            return output
        stand_in = logits.detach().clone().requires_grad_(True)
        free.append(stand_in)
        if isinstance(output, torch.Tensor):
            return stand_in
        output["logits"] = stand_in
        return output

    handle = ctx.model.register_forward_hook(swap)
    try:
        with preserved_training_state(ctx), torch.enable_grad():
            ctx.model.eval()
            loss = loss_value_tensor(ctx.compute_loss(ctx.model, batch))
            if loss is None or not free:
                return None
            (gradient,) = torch.autograd.grad(loss, free, allow_unused=True)
    except Exception:  # noqa: BLE001 - a loss this probe cannot differentiate says nothing either way
        return None
    finally:
        handle.remove()
    if gradient is None:
        return None
    return gradient.detach().abs().flatten(2).sum(-1).cpu() > 0


def loss_value_tensor(output: Any) -> torch.Tensor | None:
    """The scalar loss ``compute_loss`` returned (the first element of a tuple), if it has a graph."""
    loss = output[0] if isinstance(output, tuple) else output
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad else None


class LossPositionsCheck(Check):
    """LOSS_READS_PADDING: the loss reads one column of every row, padding in most of them."""

    name = "step.loss_positions"
    stage = Stage.STEP
    codes = ("LOSS_READS_PADDING",)
    requires = (FIRST_BATCH, FIRST_STEP)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        real = token_positions(batch)
        findings.data["summary"] = "not a padded token batch"
        if real is None or len(real) < MIN_ROWS or bool(real.all()):
            return
        real = real.cpu()
        read = read_columns(ctx, batch, real.shape[1])
        if read is None or read.shape != real.shape:
            findings.data["summary"] = "no (B, T, ...) output the loss reads through autograd"
            return
        columns = torch.nonzero(read.any(dim=0)).flatten().tolist()
        findings.data["summary"] = f"the loss reads {len(columns)} position(s) of the output"
        if len(columns) != 1:
            return
        column = columns[0]
        padded = int((~real[:, column]).sum())
        if padded < PADDED_SHARE * len(real):
            return
        width = real.shape[1]
        findings.warning(
            "LOSS_READS_PADDING",
            f"the loss reads the model's output at one position only, column {column} of {width} ({column - width} "
            f"from the end), and that column is padding in {padded} of {len(real)} rows (right padding: shorter rows "
            "end earlier): the loss never sees the prediction at a real token of most rows, or trains the model to "
            "predict the padding. A language model's loss covers every position; a per-sequence read-out takes each "
            "row's last real token",
            "Score every position: cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), "
            "ignore_index=-100); for one prediction per sequence read each row's last real position: "
            "logits[torch.arange(B), attention_mask.sum(1) - 1] (or pad on the left).",
        )
