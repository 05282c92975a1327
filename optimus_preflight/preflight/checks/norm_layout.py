"""A BatchNorm1d fed (batch, time, features) as if it were (batch, channels, length)
(``step.norm_layout``).

``nn.BatchNorm1d(C)`` reads a 3-D input as ``(B, C, L)`` and keeps one mean and variance per
dim-1 channel. A sequence is usually ``(B, T, F)``: an embedding's, a Linear's, a
``batch_first`` RNN's or Transformer layer's output, or a window of sensor readings. Given
``(B, T, F)`` with ``num_features = F`` it raises; built with ``num_features = T`` to make the
error go away, it runs and normalises each *time step* over the batch and the features: every
feature is scaled by the statistics of all the others at that step, the per-feature
normalisation the layer was put there for never happens, and position carries a learned
gain of its own.

Read from one eval-mode forward: the first ``nn.BatchNorm1d`` whose 3-D input has
``num_features`` on dim 1, a different size on dim 2, and either came straight from a module
whose last axis is its features (an Embedding, a batch_first RNN, attention or Transformer layer),
or is a tensor of the batch whose dim 1 behaves like time (neighbouring entries correlate,
as ``step.conv_layout`` reads it). A Linear's output is not taken as features-last: one
applied along time leaves the channels on dim 1, where BatchNorm1d belongs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.series import lag_one
from optimus_preflight.preflight.checks.conv_layout import MARGIN, SMOOTH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device, storages

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext



def _features_last(module: nn.Module) -> bool:
    """Whether a module's 3-D output is (batch, time, features) for sure. Not a Linear: one
    applied along time ((B, C, T) mixed over T, as TSMixer does) leaves channels on dim 1."""
    if isinstance(module, (nn.RNNBase, nn.MultiheadAttention)):
        return bool(module.batch_first)
    if isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        return bool(module.self_attn.batch_first)
    return isinstance(module, nn.Embedding)


def norm_over_time(ctx: PreflightContext) -> tuple[str, nn.BatchNorm1d, tuple[int, ...], str] | None:
    """(norm name, norm, input shape, where the input came from) of the first BatchNorm1d
    that normalises the time axis of a (B, T, F) input; None otherwise."""
    norms = {m: name for name, m in ctx.model.named_modules() if isinstance(m, nn.BatchNorm1d)}
    if not norms:
        return None
    names = {m: name for name, m in ctx.model.named_modules()}
    batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
    from_batch = storages(batch)
    made: list[tuple[torch.Tensor, str]] = []
    found: list[tuple[str, nn.BatchNorm1d, tuple[int, ...], str]] = []

    def produced(module: nn.Module, args: tuple, output: object) -> None:
        output = output[0] if isinstance(output, tuple) and output else output
        if isinstance(output, torch.Tensor) and output.dim() == 3 and _features_last(module):
            made.append((output, f"{type(module).__name__} '{names[module]}'"))

    def before(module: nn.Module, args: tuple) -> None:
        x = args[0] if args else None
        if found or not isinstance(x, torch.Tensor) or x.dim() != 3 or not x.is_floating_point():
            return
        steps, width = x.shape[1], x.shape[2]
        if module.num_features != steps or width == steps:
            return
        for output, source in made:
            if x is output or x._base is output:
                found.append((norms[module], module, tuple(x.shape), f"the output of {source}, features last"))
                return
        if x.untyped_storage().data_ptr() in from_batch:
            along_steps, along_width = lag_one(x.detach(), 1), lag_one(x.detach(), 2)
            if along_steps >= SMOOTH and along_steps >= along_width + MARGIN:
                found.append((norms[module], module, tuple(x.shape),
                              f"a batch tensor whose dim 1 is time (neighbouring entries correlate at "
                              f"{along_steps:.2f}, {along_width:.2f} along the last axis)"))

    handles = [m.register_forward_hook(produced) for m in names if _features_last(m)]
    handles += [m.register_forward_pre_hook(before) for m in norms]
    try:
        eval_forward(ctx, batch)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


class NormLayoutCheck(Check):
    """BATCHNORM_OVER_TIME: a BatchNorm1d whose channels are the time steps of a (B, T, F) input."""

    name = "step.norm_layout"
    stage = Stage.STEP
    codes = ("BATCHNORM_OVER_TIME",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        found = norm_over_time(ctx)
        if found is None:
            findings.data["summary"] = "no BatchNorm1d normalises a time axis"
            return
        name, module, shape, source = found
        findings.data.update(layer=name, shape=list(shape))
        findings.data["summary"] = f"BatchNorm1d '{name}' reads {shape} with num_features={module.num_features}"
        findings.warning(
            "BATCHNORM_OVER_TIME",
            f"nn.BatchNorm1d '{name}' (num_features={module.num_features}) gets a {shape} tensor, {source}, and "
            f"reads it as (batch, channels, length): its {shape[1]} 'channels' are the time steps, so it normalises "
            f"each step over the batch and the {shape[2]} features together, never each feature on its own. "
            "BatchNorm1d(num_features=seq_len) is what makes the shape error of a (B, T, F) input go away",
            f"Normalise the features: x = bn(x.transpose(1, 2)).transpose(1, 2) with nn.BatchNorm1d({shape[2]}), "
            f"or nn.LayerNorm({shape[2]}) on the last axis.",
        )
