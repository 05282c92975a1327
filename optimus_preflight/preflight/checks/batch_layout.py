"""``step.batch_layout``: a sequence module that reads its batch axis from the wrong
dimension (``analyses/batch_layout.py``): a time-major batch into a ``batch_first=True``
module (BATCH_TIME_MAJOR), or a batch-major one into a ``batch_first=False`` module
(BATCH_NOT_TIME_MAJOR). Judged on what the modules received during the observed step,
against the loader's batch size; without one (``batch_size=None``: a loader of
ready-made batches, e.g. the classic ``batchify`` language-model streams), against the
axis along which the targets are the inputs shifted by one: that axis is time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.analyses.batch_layout import ModuleInput, misread_axis
from optimus_preflight.preflight.analyses.channel_axis import ClassesMisread
from optimus_preflight.preflight.analyses.loss_spy import CriterionCall
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.analyses.spectral_axis import fft_over_channels_text
from optimus_preflight.preflight.analyses.view_permute import ViewAsPermute, split_in_front
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext


def _laid_out(batch: object, batch_size: int, batch_axis: int) -> tuple[int, ...] | None:
    """The shape of a batch tensor with its ``batch_size`` samples at ``batch_axis`` (0 or 1)
    and another size on the other leading axis, if any: the data's own layout, which a
    module's input only confirms (a module may see a (words, chars) tensor whose char
    axis happens to equal the batch size)."""
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2 and leaf.shape[batch_axis] == batch_size \
                and leaf.shape[1 - batch_axis] != batch_size:
            return tuple(leaf.shape)
    return None


class BatchLayoutCheck(Check):
    """A sequence module whose batch axis is not where the batch's samples are; a conv
    map pooled over its channel axis (``analyses.channel_axis``); a view to permuted sizes
    (``analyses.view_permute``); a spectral transform across the channels (``analyses.spectral_axis``)."""

    name = "step.batch_layout"
    stage = Stage.STEP
    codes = ("BATCH_TIME_MAJOR", "BATCH_NOT_TIME_MAJOR", "CHANNEL_AXIS_REDUCED", "VIEW_AS_PERMUTE",
             "ATTENTION_OVER_HEADS", "FFT_OVER_CHANNELS", "FLATTEN_ORDER_MISMATCH", "SOFTMAX_OVER_SPATIAL_AXIS")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        if probe.attention_over_heads is not None:
            shape, length = probe.attention_over_heads
            findings.error(
                "ATTENTION_OVER_HEADS",
                f"scaled_dot_product_attention gets queries of shape {shape}, whose dim 1 is the sequence "
                f"({length} positions): SDPA reads (batch, heads, sequence, head_dim), so it attends across the "
                f"{shape[2]} head slices of each position and no position ever sees another (a causal mask then "
                "masks heads, not the future). The heads were split with .view(B, T, heads, d) and not transposed",
                "Transpose after splitting the heads: q.view(B, T, heads, d).transpose(1, 2) (and back with "
                ".transpose(1, 2).reshape(B, T, heads * d) after attention).",
            )
        if probe.view_as_permute is not None and split_in_front(probe.view_as_permute.source,
                                                                 probe.view_as_permute.result):
            view = probe.view_as_permute
            b, s, e = view.source
            heads, d = view.result[1], view.result[3]
            findings.warning(
                "VIEW_AS_PERMUTE",
                f"a .{view.function}() turns a ({b}, {s}, {e}) tensor straight into ({b}, {heads}, {s}, {d}): it splits "
                f"the last axis into {heads} heads of {d} but puts them in front of the {s} positions, which a "
                "reshape cannot do (it does not move axes), so each head's 'position' rows are filled with "
                "consecutive values of several different tokens, and attention relates slices of mixed tokens "
                "instead of positions (a hand-written multi-head attention split without the transpose)",
                f"Split the heads after the positions, then swap the axes: x.view({b}, {s}, {heads}, {d}).transpose(1, "
                f"2) (and back with .transpose(1, 2).reshape({b}, {s}, {e}) after attention).",
            )
        elif probe.view_as_permute is not None and _channels_last_image(probe.view_as_permute):
            view = probe.view_as_permute
            n, h, w, c = view.source
            findings.warning(
                "VIEW_AS_PERMUTE",
                f"a .{view.function}() turns a ({n}, {h}, {w}, {c}) channels-last (NHWC, HWC per image: numpy, PIL, "
                f"cv2) image batch into ({n}, {c}, {h}, {w}) channels-first: a reshape does not move the channel "
                "axis, it cuts the interleaved RGBRGB... memory into planes, so each 'channel' plane is a strip of "
                "pixels of every colour and the image is scrambled",
                "Move the axis: x.permute(0, 3, 1, 2) for a batch (img.permute(2, 0, 1) for one HWC image, as "
                "torchvision's ToTensor does), not .view/.reshape.",
            )
        elif probe.view_as_permute is not None and _logits_for_class_dim(probe.view_as_permute, probe.criterion_calls):
            view = probe.view_as_permute
            b, t, c = view.source
            findings.warning(
                "VIEW_AS_PERMUTE",
                f"a .{view.function}() instead of a transpose turns ({b}, {t}, {c}) sequence logits into ({b}, {c}, {t}) "
                f"for the criterion, which reads the class dimension second (N, C, d): a view does not swap axes, it "
                f"cuts the memory in a new shape, so each (class, position) slot holds the scores of other positions "
                "and classes, and every token's loss is computed on scrambled logits",
                f"Move the class axis: logits.permute(0, 2, 1) (or .transpose(1, 2)) before cross_entropy, or "
                f"flatten instead: cross_entropy(logits.reshape(-1, {c}), tags.reshape(-1)).",
            )
        elif probe.view_as_permute is not None and len(probe.view_as_permute.source) > len(probe.view_as_permute.result):
            view = probe.view_as_permute
            findings.warning(
                "VIEW_AS_PERMUTE",
                f"a .{view.function}() turns a {view.source} tensor into {view.result}: the result lists the axes in "
                "another order than they are stored (an axis moved in front of others that are merged), and a "
                "reshape does not move axes, it reads the memory in a new shape. A CRNN that turns (N, C, F, T) conv "
                "features into a (N, T, C * F) sequence with x.reshape(n, t, c * f) without permuting time to the "
                "front feeds the RNN 'time steps' that are frequency rows holding whole time profiles, not frames",
                "Move the axis first, then merge: x.permute(0, 3, 1, 2).reshape(n, t, c * f) (time to the front), "
                "or in general .permute(...) to the result's axis order before .reshape.",
            )
        elif probe.view_as_permute is not None:
            view = probe.view_as_permute
            message, fix = _generic_view_text(view)
            findings.warning("VIEW_AS_PERMUTE", message, fix)
        if probe.flatten_mismatch is not None and probe.flatten_mismatch.class_axis is not None:
            found = probe.flatten_mismatch
            shape = found.class_axis
            order = "0, " + ", ".join(str(i) for i in range(2, len(shape))) + ", 1"
            findings.error(
                "FLATTEN_ORDER_MISMATCH",
                f"{found.function} gets class scores viewed from a {shape} channels-first tensor with the class axis "
                f"(dim 1, {shape[1]} classes) not moved last: view(-1, {shape[1]}) or reshape(-1, {shape[1]}) fills "
                f"each row with {shape[1]} neighbouring values of one class's map, not one pixel's (or step's) scores "
                "for every class, so every pixel is scored with numbers from other pixels against its own label",
                f"Move the class axis last before flattening: logits.permute({order}).reshape(-1, {shape[1]}) "
                "against targets.reshape(-1); or give cross_entropy the (N, C, H, W) logits and (N, H, W) targets "
                "as they are, without flattening.",
            )
        elif probe.flatten_mismatch is not None:
            found = probe.flatten_mismatch
            if found.stacked_dim == 0:
                # A decoder loop's per-step outputs stacked step-major: the layout comes from the stack.
                cause = (f"The predictions are torch.stack(outputs, dim=0) of the per-step outputs of a loop (a "
                         f"decoder stepping through time): stacking along dim 0 makes them time-major {found.prediction_axes}, "
                         f"while the targets are batch-major {found.target_axes}")
                fix = ("Stack the steps along the time axis of a batch-first layout: torch.stack(outputs, dim=1) "
                       "(B, T, C), then reshape(-1, C) against targets.reshape(-1).")
            else:
                cause = ("A seq-first (T, B, C) output (nn.TransformerEncoder, nn.LSTM/GRU without batch_first=True) "
                         "flattened with reshape(-1, C) against batch-first (B, T) targets does this")
                fix = ("Bring both to one layout before flattening: logits.transpose(0, 1).reshape(-1, C) against "
                       "targets.reshape(-1) (or build the model with batch_first=True).")
            findings.error(
                "FLATTEN_ORDER_MISMATCH",
                f"{found.function} gets predictions flattened from {found.prediction_axes} leading axes and targets "
                f"flattened from {found.target_axes}: the same number of rows in a different order, so row i of the "
                "predictions and row i of the targets belong to different positions of different samples and every "
                f"token is scored against another token's label. {cause}",
                fix,
            )
        if probe.classes_misread is not None and probe.flatten_mismatch is None:
            self._classes_misread(probe.classes_misread, findings)
        if probe.fft_over_channels is not None:
            findings.warning("FFT_OVER_CHANNELS", *fft_over_channels_text(probe.fft_over_channels))
        if probe.channel_reduction is not None and len(probe.channel_reduction.shape) == 3:
            found = probe.channel_reduction
            findings.warning(
                "CHANNEL_AXIS_REDUCED",
                f"a {found.function}(dim=1) reduces the {found.shape} (N, C, L) output of a Conv1d over its channel "
                f"(filter) axis and keeps the length: the {found.shape[1]} filters are averaged away and the head reads "
                f"one number per time step ({found.shape[2]} of them) instead of the features. mean(dim=1) is the "
                "global average pool of a channels-last (N, L, C) map, as Keras' GlobalAveragePooling1D; PyTorch's "
                "Conv1d keeps the channels on dim 1",
                "Pool over the length axis: h.mean(dim=2) (or nn.AdaptiveAvgPool1d(1) and flatten), and size the head "
                "by the number of filters.",
            )
        elif probe.channel_reduction is not None:
            found = probe.channel_reduction
            kept = ({2, 3} - set(found.dims)).pop()
            findings.warning(
                "CHANNEL_AXIS_REDUCED",
                f"a {found.function}(dim={found.dims}) reduces the {found.shape} NCHW output of a convolution over "
                f"its channel axis and one spatial axis, keeping the {'height' if kept == 2 else 'width'} axis: the "
                "axes (1, 2) of a channels-last (NHWC) global pool, as in Keras' GlobalAveragePooling2D. The "
                "features are averaged away and the next layer reads one number per image "
                f"{'row' if kept == 2 else 'column'}",
                "Pool over the spatial axes of an NCHW map: h.mean(dim=(2, 3)) (or nn.AdaptiveAvgPool2d(1) and "
                "flatten).",
            )
        batch_size = getattr(ctx.train_loader, "batch_size", None)
        findings.data["modules"] = [{"name": s.name, "kind": s.kind, "batch_first": s.batch_first, "input": list(s.shape)}
                                    for s in probe.layout_inputs]
        findings.data["summary"] = (f"{len(probe.layout_inputs)} sequence module(s) checked against batch size {batch_size}"
                                    if probe.layout_inputs else "no batch_first-aware sequence module ran")
        if not isinstance(batch_size, int) or batch_size < 2:
            self._judge_by_shift(probe.layout_inputs, ctx.artifacts.first_batch, findings)
            return
        hf_shape = _hugging_face_time_major(ctx.model, ctx.artifacts.first_batch, batch_size)
        if hf_shape is not None:
            name = getattr(ctx.model, "main_input_name", "input_ids")
            findings.warning(
                "BATCH_TIME_MAJOR",
                f"the batch's {name!r} has shape {hf_shape}: the loader's batch of {batch_size} samples is dim 1, "
                f"but {type(ctx.model).__name__} reads (batch, sequence), so it takes the {hf_shape[0]} positions "
                f"for samples and attends across the {batch_size} samples",
                "Collate batch-major: pad with torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True) (or a "
                "transformers DataCollator) so every tensor of the batch is (batch, sequence).",
            )
            return
        record = misread_axis(probe.layout_inputs, batch_size)
        data_shape = None if record is None else \
            _laid_out(ctx.artifacts.first_batch, batch_size, 1 if record.batch_first else 0)
        if record is None or data_shape is None:
            # The batch size cannot tell the axes apart (it equals the sequence length, or
            # no tensor carries it): next-token targets still can.
            self._judge_by_shift(probe.layout_inputs, ctx.artifacts.first_batch, findings)
            return
        module = f"{record.kind} '{record.name}'"
        if record.batch_first:
            findings.warning(
                "BATCH_TIME_MAJOR",
                f"the batch holds a tensor of shape {data_shape}, time-major, and {module} has batch_first=True "
                f"but receives {record.shape}: the loader's batch of {batch_size} samples is dim 1, so the module takes the {record.shape[0]} time steps for the "
                f"batch and runs its {_mixing(record)} across the {batch_size} samples instead of along each "
                "sequence. Nothing raises when the targets are laid out the same way",
                "Collate batch-major: torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True) in the collate_fn "
                "(or x.transpose(0, 1) before the module); or build the module with batch_first=False if the "
                "whole model is time-major.",
            )
        else:
            findings.warning(
                "BATCH_NOT_TIME_MAJOR",
                f"{module} has batch_first=False (the default: it reads (time, batch, features)) but receives "
                f"{record.shape}, with the loader's batch of {batch_size} samples at dim 0: it takes the "
                f"{batch_size} samples for time steps and runs its {_mixing(record)} across them",
                f"Build the module with batch_first=True (nn.{record.kind}(..., batch_first=True)), or pass it "
                "x.transpose(0, 1).",
            )

    @staticmethod
    def _classes_misread(found: ClassesMisread, findings: Findings) -> None:
        n, channels, height, width = found.shape
        if found.kind == "softmax":
            axis = "height" if found.detail[0] == 2 else "width"
            findings.warning(
                "SOFTMAX_OVER_SPATIAL_AXIS",
                f"a {found.function}(dim={found.detail[0] - 4}) normalises the ({n}, {channels}, {height}, {width}) "
                f"NCHW output of a convolution over its {axis} axis: each pixel's {channels} class scores never "
                f"compete, while the pixels of one image {'column' if axis == 'height' else 'row'} do (Keras' "
                "channels-last default, axis=-1, on a channels-first map)",
                f"Normalise over the class axis of an NCHW map: {found.function}(logits, dim=1).",
            )
        elif found.kind == "split":
            view = ", ".join(str(size) for size in found.detail)
            classes = found.detail[-1]
            findings.error(
                "FLATTEN_ORDER_MISMATCH",
                f"a .{found.function}({view}) reads the ({n}, {channels}, {height}, {width}) NCHW output of a "
                f"convolution, {channels // classes} groups (anchors) of {classes} class scores per cell, with the "
                f"class axis last without moving it there: a view keeps the memory order, which runs along the width, "
                f"so each row of {classes} 'scores' holds {classes} neighbouring cells of one channel, and every "
                "anchor and cell is scored with other cells' numbers against its own target",
                f"Move the channels last first: out.permute(0, 2, 3, 1).reshape({n}, -1, {classes}), which orders "
                "the rows (cell row, cell column, anchor) like the targets.",
            )
        else:
            findings.error(
                "FLATTEN_ORDER_MISMATCH",
                f"a transpose of the ({n}, {channels}, {height}, {width}) NCHW class scores to {found.detail} moves "
                f"the classes last but also swaps height and width ((N, W, H, C), as transpose(1, 3) does): flattened, "
                "its rows run column by column while (N, H, W) targets flattened run row by row, so pixel (h, w) is "
                "scored against the label of pixel (w, h)" + (" (with a square map the shapes still match)"
                                                                  if height == width else ""),
                "Move the classes last keeping the spatial order: logits.permute(0, 2, 3, 1).reshape(-1, C) against "
                "targets.reshape(-1).",
            )

    @staticmethod
    def _judge_by_shift(inputs: list[ModuleInput], batch: object, findings: Findings) -> None:
        """A loader without a batch size: the next-token targets tell the time axis."""
        shifted = next_token_axis(batch)
        if shifted is None:
            return
        axis, shape = shifted
        findings.data["next_token_axis"] = axis
        for record in inputs:
            if len(record.shape) < 2 or tuple(record.shape[:2]) != shape[:2]:
                continue
            module = f"{record.kind} '{record.name}'"
            if axis == 0 and record.batch_first:
                findings.warning(
                    "BATCH_TIME_MAJOR",
                    f"the batch's targets are its inputs shifted by one along dim 0 of {shape}, so dim 0 is time "
                    f"(time-major, as batchify makes), but {module} has batch_first=True and receives {record.shape}: "
                    f"it takes the {shape[0]} time steps for samples and runs its {_mixing(record)} across the "
                    f"{shape[1]} parallel streams instead of along them",
                    "Transpose the batch to (batch, time) before the model (x.t().contiguous(), and the targets "
                    "alike), or build the module with batch_first=False if the whole model is time-major.",
                )
                return
            if axis == 1 and not record.batch_first:
                findings.warning(
                    "BATCH_NOT_TIME_MAJOR",
                    f"the batch's targets are its inputs shifted by one along dim 1 of {shape}, so dim 1 is time, "
                    f"but {module} has batch_first=False (reads (time, batch, ...)) and receives {record.shape}: it "
                    f"takes the {shape[0]} sequences for time steps and runs its {_mixing(record)} across them",
                    f"Build the module with batch_first=True (nn.{record.kind}(..., batch_first=True)), or pass it "
                    "x.transpose(0, 1).",
                )
                return


SHIFT_AGREEMENT = 0.9  # of positions where target[t] == input[t + 1]: next-token targets
MIN_SHIFT_LENGTH = 4


def next_token_axis(batch: object) -> tuple[int, tuple[int, ...]] | None:
    """``(axis, shape)`` when the batch holds integer (d0, d1) inputs and targets where
    the targets are the inputs shifted by one along exactly one axis: language-model
    streams, whose shift axis is time whatever the layout."""
    tensors = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() == 2
               and not leaf.is_floating_point() and leaf.dtype != torch.bool]
    for inputs in tensors:
        for targets in tensors:
            if targets is inputs or targets.shape != inputs.shape:
                continue
            agreeing = [axis for axis in (0, 1) if inputs.shape[axis] >= MIN_SHIFT_LENGTH
                        and _agreement(inputs, targets, axis) >= SHIFT_AGREEMENT]
            if len(agreeing) == 1:
                return agreeing[0], tuple(inputs.shape)
    return None


def _agreement(inputs: torch.Tensor, targets: torch.Tensor, axis: int) -> float:
    length = inputs.shape[axis]
    ahead = inputs.narrow(axis, 1, length - 1)
    return float((ahead == targets.narrow(axis, 0, length - 1)).float().mean())


def _hugging_face_time_major(model: object, batch: object, batch_size: int) -> tuple[int, ...] | None:
    """A Hugging Face model (batch-major by contract: ``main_input_name``) given a mapping
    batch whose main input is token ids laid out (sequence, batch). Token ids only: pixel
    values (B, 3, H, W) of a short first batch under batch_size=3 would look the same."""
    name = getattr(model, "main_input_name", None)
    if not isinstance(name, str) or not isinstance(batch, Mapping):
        return None
    tensor = batch.get(name)
    if isinstance(tensor, torch.Tensor) and tensor.dim() == 2 and not tensor.is_floating_point() \
            and tensor.shape[1] == batch_size and tensor.shape[0] != batch_size:
        return tuple(tensor.shape)
    return None


def _logits_for_class_dim(view: ViewAsPermute, calls: list[CriterionCall]) -> bool:
    """A (B, T, C) tensor viewed as (B, C, T) and handed to a class criterion of C classes."""
    if len(view.source) != 3 or len(view.result) != 3:
        return False
    b, t, c = view.source
    return view.result == (b, c, t) and any(call.function in ("cross_entropy", "nll_loss") and call.n_classes == c
                                            and call.input is not None and call.input.shape == (b, c, t)
                                            for call in calls)


def axis_order(source: tuple[int, ...], result: tuple[int, ...]) -> tuple[int, ...] | None:
    """The permutation ``p`` with ``result[i] == source[p[i]]``, keeping an axis in place
    where its size allows (so equal sizes resolve to the smallest move), or None."""
    free = list(range(len(source)))
    order: list[int] = []
    for position, size in enumerate(result):
        candidates = [axis for axis in free if source[axis] == size]
        if not candidates:
            return None
        axis = position if position in candidates else candidates[0]
        free.remove(axis)
        order.append(axis)
    return tuple(order)


def _generic_view_text(view: ViewAsPermute) -> tuple[str, str]:
    """The words for a view to the same sizes in another order, naming the permute that
    gives the intended layout; a (K, B) tensor with few rows is named as what it usually
    is, K per-field tensors that default_collate made from a per-sample list or tuple,
    stacked along dim 0."""
    order = axis_order(view.source, view.result)
    permute = f".permute({', '.join(str(axis) for axis in order)})" if order is not None else ".permute(...)"
    message = (f"a .{view.function}() turns a {view.source} tensor into {view.result}: the same sizes in another "
               "order. A view does not swap axes, it reads the memory in a new shape, so every row of the result "
               "holds a run of values from different positions of the old axes, interleaved (e.g. a (B, T, C) "
               "sequence viewed as (B, C, T) for a Conv1d mixes time steps into channels)")
    fix = (f"Use x{permute} (or .transpose(a, b)) instead of .view/.reshape to swap the axes (then .contiguous() "
           "if a view is needed next).")
    if len(view.source) == 2 and view.result == view.source[::-1] and view.source[0] < view.source[1]:
        fields, rows = view.source
        message += (f". A ({fields}, {rows}) tensor is what torch.stack(fields) gives for the list of {fields} "
                    f"per-field tensors that default_collate makes when each sample returns its {fields} targets or "
                    f"features as a list or tuple (one tensor per field, not one per sample): viewed as ({rows}, "
                    f"{fields}), row i holds one field's values of samples {fields}i to {fields}i+{fields - 1}, not sample i's "
                    "fields")
        fix = (f"Stack the collated fields along dim 1: torch.stack(fields, dim=1) gives ({rows}, {fields}) "
               f"(or x.t() / x{permute}), instead of .view/.reshape; or return one tensor per sample from "
               "__getitem__ (torch.tensor([a, b])) so default_collate stacks whole samples.")
    return message, fix


def _channels_last_image(view: ViewAsPermute) -> bool:
    """An (N, H, W, C) image batch of 1, 3 or 4 channels viewed as (N, C, H, W) (pure)."""
    source, result = view.source, view.result
    return (len(source) == 4 and source[3] in (1, 3, 4) and source[1] > 4 and source[2] > 4
            and result == (source[0], source[3], source[1], source[2]))


def _mixing(record: ModuleInput) -> str:
    return "recurrence" if record.recurrent else "attention"
