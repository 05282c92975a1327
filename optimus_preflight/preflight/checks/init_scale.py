"""Weights initialised on the wrong scale for the depth (``model.init_scale``).

A layer multiplies the size of what it receives by about ``std(W) * sqrt(fan_in)`` (times
~0.7 behind a ReLU). PyTorch's default init gives ~0.58 and He init ~1.4, so activations
keep their size through any depth. ``nn.init.normal_(w, 0, 1)`` on 256 inputs gives 16:
six such layers multiply the activations by ~10^7, the softmax saturates and the first
steps blow up. ``normal_(w, 0, 0.001)`` gives 0.016: the output is ~0 for every input and the
gradients reaching the first layers vanish.

Read from the weights (the gain of every Linear and Conv layer that trains) and from one
eval-mode forward: the finding needs three or more layers on the wrong side and an output
that shows it, far larger or far smaller than the input. A normalisation layer after each
of them (BatchNorm, LayerNorm) absorbs the scale, and the output then shows nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import model_outputs
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

LARGE_GAIN, SMALL_GAIN = 4.0, 0.1
MIN_LAYERS = 3
# How much the outputs differ between samples over how much the inputs do: what the gains
# compounded to (a last layer's bias, the same for every sample, does not count).
EXPLODED, VANISHED = 1e3, 1e-3
LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def gain(module: nn.Module) -> float | None:
    """std(W) * sqrt(fan_in): the factor a layer scales its input's size by."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or weight.numel() < 16:
        return None
    fan_in = weight[0].numel()
    return float(weight.detach().float().std()) * math.sqrt(fan_in)


def _spread(tensors: list[torch.Tensor]) -> float | None:
    """The RMS over every value of its deviation from the batch mean: how much the samples
    differ (a constant bias, the same for every sample, does not count)."""
    values = [t.detach().float() for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()
              and t.dim() >= 1 and t.shape[0] > 1]
    if not values:
        return None
    deviations = [v - v.mean(dim=0, keepdim=True) for v in values]
    return math.sqrt(sum(float(d.pow(2).sum()) for d in deviations) / sum(d.numel() for d in deviations))


class InitScaleCheck(Check):
    """INIT_SCALE: weights whose init multiplies (or divides) the activations at every layer."""

    name = "model.init_scale"
    stage = Stage.STEP
    codes = ("INIT_SCALE",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        gains = [(name, g) for name, module in ctx.model.named_modules() if isinstance(module, LAYERS)
                 and module.weight.requires_grad and (g := gain(module)) is not None]
        large = [(name, g) for name, g in gains if g >= LARGE_GAIN]
        small = [(name, g) for name, g in gains if g <= SMALL_GAIN]
        findings.data["gains"] = {name: round(g, 3) for name, g in gains[:32]}
        findings.data["summary"] = f"{len(large)} layer(s) with gain >= {LARGE_GAIN:g}, {len(small)} <= {SMALL_GAIN:g}"
        side = large if len(large) >= MIN_LAYERS else small if len(small) >= MIN_LAYERS else None
        if side is None:
            return
        batch = ctx.artifacts.first_batch
        inputs = _spread([leaf for leaf in leaves(move_to_device(batch, ctx.device))
                       if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()])
        outputs = model_outputs(ctx, batch)
        output = _spread(outputs) if outputs else None
        if not inputs or output is None:
            return
        ratio = output / inputs
        findings.data["output_over_input"] = ratio
        exploded = side is large and ratio >= EXPLODED
        vanished = side is small and ratio <= VANISHED
        if not (exploded or vanished):
            return
        shown = ", ".join(f"'{name}' {g:.3g}" for name, g in side[:4]) + (" ..." if len(side) > 4 else "")
        if exploded:
            effect = (f"multiplies the activations at every layer, so the outputs differ between samples {ratio:.2g}x as "
                      "much as the inputs do: logits saturate the softmax, the first losses are huge and the first "
                      "steps overwrite the weights")
        else:
            effect = (f"divides the activations at every layer, so the outputs differ between samples only {ratio:.2g}x "
                      "as much as the inputs do: the model answers the same whatever the input, and the gradients "
                      "reaching the first layers vanish")
        findings.warning(
            "INIT_SCALE",
            f"{len(side)} layer(s) are initialised on the wrong scale for their width: std(W) * sqrt(fan_in), the factor "
            f"a layer scales its input by, is {shown} (PyTorch's default init gives ~0.6, He init ~1.4). The init "
            f"{effect}. A fixed std (nn.init.normal_(w, 0, 1) or (0, 0.001)) ignores the layer's fan-in",
            "Initialise by fan-in: keep the layers' default init, or nn.init.kaiming_normal_(w, nonlinearity='relu') "
            "(xavier_normal_ for tanh/sigmoid); a fixed std must be about 1 / sqrt(fan_in) (e.g. 0.06 for 256 "
            "inputs), or put a normalisation layer after each block.",
        )
