"""A Conv1d fed (batch, time, features) as if it were (batch, channels, time) (``step.conv_layout``).

``nn.Conv1d`` reads ``(B, C, L)`` and slides along the last axis. A window of a series is
usually stored ``(B, T, F)`` (time steps, then sensors or leads), and built to match it the
layer gets ``in_channels = T``: every time step becomes a channel, and the kernel slides over
the handful of sensors instead of over time. Nothing raises, and the model cannot learn
temporal patterns.

Read from one eval-mode forward: the first ``nn.Conv1d`` whose input is a tensor of the batch
as the loader gave it, ``(B, A, L)`` with ``A == in_channels`` at least twice ``L``, and whose
axis 1 behaves like time: neighbouring entries along it correlate (lag-1 autocorrelation of
0.5 or more, 0.2 above the one along the last axis), or the last axis is a handful of
positions (16 or fewer, under a quarter of the channels) that no kernel would be slid over.
Signals stored channels-first (12 ECG leads over 1000 samples) and mel spectrograms (64-128
bins over a hundred frames or more) have the long axis last and stay quiet.

The same mistake on text: an ``nn.Embedding`` output ``(B, T, E)`` handed to a Conv1d built
with ``in_channels = T`` (the "first dim after the batch" of a tutorial's shape comment),
without ``permute(0, 2, 1)``: the token positions become channels and the kernel slides
over the embedding's dimensions. Read from the same forward: a Conv1d whose input is an
embedding layer's output, with ``in_channels`` the sequence length, not ``embedding_dim``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.series import lag_one
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import move_to_device, storages

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SMOOTH = 0.5
MARGIN = 0.2
MIN_RATIO = 2  # channels over length
FEW_POSITIONS, FEW_RATIO = 16, 4


def first_reader(ctx: PreflightContext, kind: type | tuple[type, ...]) -> tuple[str, nn.Module, torch.Tensor] | None:
    """(name, module, input) of the first module of ``kind`` that reads a 3-D float tensor of the
    batch as the loader gave it, in one eval-mode forward; None when none does."""
    modules = {m: name for name, m in ctx.model.named_modules() if isinstance(m, kind)}
    if not modules:
        return None
    batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
    from_batch = storages(batch)
    seen: list[tuple[str, nn.Module, torch.Tensor]] = []

    def before(module: nn.Module, args: tuple) -> None:
        x = args[0] if args else None
        if not seen and isinstance(x, torch.Tensor) and x.dim() == 3 and x.is_floating_point() \
                and x.untyped_storage().data_ptr() in from_batch:
            seen.append((modules[module], module, x.detach()))

    handles = [module.register_forward_pre_hook(before) for module in modules]
    try:
        eval_forward(ctx, batch)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    return seen[0] if seen else None


def conv_over_embedding(ctx: PreflightContext) -> tuple[str, nn.Module, str, tuple[int, ...]] | None:
    """(conv name, conv, embedding name, input shape) of the first Conv1d that reads an
    nn.Embedding's (B, T, E) output as (batch, channels, length) with in_channels == T != E,
    in one eval-mode forward; None otherwise."""
    convs = {m: name for name, m in ctx.model.named_modules() if isinstance(m, nn.Conv1d)}
    embeddings = {m: name for name, m in ctx.model.named_modules() if isinstance(m, nn.Embedding)}
    if not convs or not embeddings:
        return None
    made: list[tuple[torch.Tensor, str, int]] = []
    found: list[tuple[str, nn.Module, str, tuple[int, ...]]] = []

    def embedded(module: nn.Module, args: tuple, output: object) -> None:
        if isinstance(output, torch.Tensor) and output.dim() == 3:
            made.append((output, embeddings[module], module.embedding_dim))

    def before(module: nn.Module, args: tuple) -> None:
        x = args[0] if args else None
        if found or not isinstance(x, torch.Tensor) or x.dim() != 3:
            return
        for output, name, width in made:
            if (x is output or x._base is output) and x.shape[2] == width and module.in_channels == x.shape[1] \
                    and x.shape[1] != width:
                found.append((convs[module], module, name, tuple(x.shape)))
                return

    handles = [m.register_forward_hook(embedded) for m in embeddings] + [m.register_forward_pre_hook(before) for m in convs]
    try:
        eval_forward(ctx, ctx.artifacts.first_batch)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


class ConvLayoutCheck(Check):
    """CONV1D_TIME_AS_CHANNELS: a Conv1d sliding over the features, its channels being time;
    RNN_TIME_AS_FEATURES: an RNN stepping over the channels, its features being time."""

    name = "step.conv_layout"
    stage = Stage.STEP
    codes = ("CONV1D_TIME_AS_CHANNELS", "RNN_TIME_AS_FEATURES")
    requires = (FIRST_STEP,)

    @staticmethod
    def _recurrent(ctx: PreflightContext, findings: Findings) -> None:
        """RNN_TIME_AS_FEATURES: a batch_first RNN given a channels-first (B, channels, time) window,
        its input_size the time steps: it runs over the handful of channels as its sequence."""
        found = first_reader(ctx, nn.RNNBase)
        if found is None:
            return
        name, module, x = found
        steps, width = x.shape[1], x.shape[2]
        if not getattr(module, "batch_first", False) or module.input_size != width or steps > FEW_POSITIONS \
                or width < FEW_RATIO * steps:
            return
        along_steps, along_features = lag_one(x, 1), lag_one(x, 2)
        findings.data.update(recurrent_layer=name, recurrent_input=list(x.shape),
                             lag1_steps=round(along_steps, 3), lag1_features=round(along_features, 3))
        if along_features < SMOOTH or along_features < along_steps + MARGIN:
            return
        findings.warning(
            "RNN_TIME_AS_FEATURES",
            f"{type(module).__name__} '{name}' (batch_first, input_size={width}) reads the batch's {tuple(x.shape)} "
            f"tensor as (batch, time, features): its {steps} 'time steps' are the channels of a channels-first "
            f"window and its {width} 'features' are the time axis (neighbouring entries along it correlate at "
            f"{along_features:.2f}, against {along_steps:.2f} along the {steps} 'steps'). The recurrence runs over "
            "the sensors instead of over time, and each step sees the whole series at once as a bag of features",
            f"Feed it (batch, time, channels): x.transpose(1, 2) (or permute(0, 2, 1)) before the layer, and "
            f"{type(module).__name__}(input_size={steps}, ..., batch_first=True).",
        )

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        self._recurrent(ctx, findings)
        if not any(isinstance(m, nn.Conv1d) for m in ctx.model.modules()):
            findings.data.setdefault("summary", "no Conv1d")
            return
        embedded = conv_over_embedding(ctx)
        if embedded is not None:
            name, module, embedding, shape = embedded
            findings.data.update(layer=name, shape=list(shape), embedding=embedding)
            findings.warning(
                "CONV1D_TIME_AS_CHANNELS",
                f"nn.Conv1d '{name}' (in_channels={module.in_channels}) reads the {shape} output of the embedding "
                f"'{embedding}' as (batch, channels, length): its {shape[1]} channels are the token positions and "
                f"its length is the {shape[2]} embedding dimensions, so the kernel slides over the embedding's "
                "dimensions instead of along the text, and the n-gram features a text CNN is built for never form",
                f"Put the embedding on the channel axis: x = embedded.permute(0, 2, 1) (or .transpose(1, 2)) before "
                f"the convolution, and nn.Conv1d(in_channels={shape[2]}, ...) (the embedding_dim).",
            )
            return
        found = first_reader(ctx, nn.Conv1d)
        if found is None:
            findings.data["summary"] = "no Conv1d reads a batch tensor directly"
            return
        name, module, x = found
        channels, length = x.shape[1], x.shape[2]
        along_channels, along_length = lag_one(x, 1), lag_one(x, 2)
        findings.data.update(layer=name, shape=list(x.shape), lag1_channels=round(along_channels, 3),
                             lag1_length=round(along_length, 3))
        findings.data["summary"] = f"Conv1d '{name}' reads {tuple(x.shape)}"
        time_like = along_channels >= SMOOTH and along_channels >= along_length + MARGIN
        # Noisy windows hide the smoothness; a "length" of a few entries under many times as many
        # "channels" is the other sign: no one slides a kernel over 8 positions of 96-channel data.
        few_positions = length <= FEW_POSITIONS and channels >= FEW_RATIO * length
        if module.in_channels != channels or channels < MIN_RATIO * length or not (time_like or few_positions):
            return
        findings.warning(
            "CONV1D_TIME_AS_CHANNELS",
            f"nn.Conv1d '{name}' reads the batch's {tuple(x.shape)} tensor as (batch, channels, length) with "
            f"in_channels={channels}: its {channels} 'channels' look like time steps (neighbouring entries along that "
            f"axis correlate at {along_channels:.2f}, against {along_length:.2f} along the last axis, which holds only "
            f"{length} positions), so the kernel "
            f"slides over the {length} features (sensors, leads) instead of over time and no temporal pattern can "
            "be learned. A (batch, time, features) window fed to a Conv1d built with in_channels = time does this",
            f"Put the features on the channel axis: x.transpose(1, 2) (or permute(0, 2, 1)) before the layer, and "
            f"nn.Conv1d(in_channels={length}, ...).",
        )
