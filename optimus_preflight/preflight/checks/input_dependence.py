"""A model whose output is the same for every sample (``step.input_dependence``).

Different samples must give different outputs. When every sample of a batch gets the
same output, nothing the model learns can depend on the input: a ``forward`` that reads
something other than its argument, an input multiplied by a zeroed mask, an attention
mask that hides every token, or a layer whose units are all dead (a ReLU after a large
negative bias). The loss still falls, to the label prior, so training "works".

The probe: one eval-mode forward of the first samples of the first batch without
gradients, with a forward hook on every module. The first module (in call order) whose
output is the same for every sample, while its input was not, is where the samples'
differences are lost; it is named. A zero-initialised output layer (ViT-style heads) loses
them by design at step 0 and stays quiet: its weight is all zeros.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.checks.sample_mixing import PROBE_SAMPLES, batch_axis, probe_batches
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES = 4
SAME = 1e-6  # of the tensor's largest value: rows this close are the same output


def varies(tensor: Any, size: int) -> bool | None:
    """Whether the rows of a per-sample tensor (batch axis of ``size``) differ; None when
    it has no such axis or is not floating."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.dim() == 0:
        return None
    axis = batch_axis(tensor, size)
    if axis is None:
        return None
    rows = tensor.detach().float().movedim(axis, 0).reshape(size, -1)
    if not bool(torch.isfinite(rows).all()):
        return None
    scale = float(rows.abs().max().clamp_min(1e-12))
    return bool(((rows - rows[0]).abs() > SAME * scale).any())


def _any_varies(value: Any, size: int) -> bool | None:
    verdicts = [v for leaf in leaves(value) if (v := varies(leaf, size)) is not None]
    return any(verdicts) if verdicts else None


class InputDependenceCheck(Check):
    """MODEL_IGNORES_INPUT: every sample of a batch gets the same output."""

    name = "step.input_dependence"
    stage = Stage.STEP
    codes = ("MODEL_IGNORES_INPUT",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        size = getattr(ctx.train_loader, "batch_size", None) or batch_size_of(batch)
        if not size or size < MIN_SAMPLES:
            findings.data["summary"] = "batch too small to probe"
            return
        keep = min(size, PROBE_SAMPLES)
        probe, _ = probe_batches(batch, size, keep)
        if not _any_varies(probe, keep):
            findings.data["summary"] = "the samples of the batch do not differ"
            return
        trace = self._trace(ctx, probe, keep)
        if trace is None:
            findings.data["summary"] = "the forward could not be observed"
            return
        output_varies, lost_at = trace
        findings.data["summary"] = "outputs differ between samples" if output_varies is not False else \
            "every sample gets the same output"
        if output_varies is not False:
            return
        if lost_at is not None and isinstance(lost_at[1], (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)) \
                and not bool(lost_at[1].weight.detach().any()):
            findings.data["summary"] = f"the zero-initialised {lost_at[0]!r} gives every sample its bias"
            return
        where = (f" The samples' differences are lost at {type(lost_at[1]).__name__} '{lost_at[0]}': its input "
                 "differs between samples and its output does not") if lost_at is not None else \
            " No module's output differed between samples: the forward does not use what differs in the batch"
        findings.error(
            "MODEL_IGNORES_INPUT",
            f"the model gives the same output to all {keep} samples of the first batch (eval mode, no gradients), "
            f"although the samples differ: nothing it learns can depend on the input, and the loss can only fall to "
            f"the label prior.{where}",
            "Look there for what throws the input away: a forward that reads another tensor than its argument, an "
            "input multiplied by a zeroed mask, an attention mask that hides every token, or units that are all dead "
            "(a ReLU after a large negative bias or a bad init): re-initialise them or use a leaky activation.",
        )

    @staticmethod
    def _trace(ctx: PreflightContext, batch: Any, size: int) -> tuple[bool | None, tuple[str, nn.Module] | None] | None:
        names = {module: name or type(module).__name__ for name, module in ctx.model.named_modules()}
        lost: list[tuple[str, nn.Module]] = []
        top: list[Any] = []

        def on_forward(module: nn.Module, args: tuple, output: Any) -> None:
            if module is ctx.model:
                if not top:
                    top.append(output)
                return
            if not lost and _any_varies(args, size) and _any_varies(output, size) is False:
                lost.append((names[module], module))

        handles = [module.register_forward_hook(on_forward) for module in names]
        try:
            with preserved_training_state(ctx), torch.no_grad():
                ctx.model.eval()
                with ctx.training.plan.autocast():
                    ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))
        except Exception:
            return None
        finally:
            for handle in handles:
                handle.remove()
        if not top:
            return None
        return _any_varies(top[0], size), (lost[0] if lost else None)
