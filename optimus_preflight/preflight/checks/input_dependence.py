"""A model whose output is the same for every sample, or ignores half of each sequence
(``step.input_dependence``).

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

Half a sequence ignored: a classifier reading ``out[:, 0]`` of a unidirectional RNN (the
state after the first token), a slice that keeps the first positions. Each sequence input
of the batch (``(B, T)`` token ids or ``(B, T, F)`` features, ``T >= MIN_POSITIONS``) gets
the non-padding positions of one half replaced by those of the next sample; when no
sample's output moves, while changing whole samples does move it, that half is ignored.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import eval_forward, model_outputs
from optimus_preflight.preflight.analyses.loss_spy import REGRESSION_CRITERIA
from optimus_preflight.preflight.analyses.padding import edge_padding
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.sample_mixing import PROBE_SAMPLES, batch_axis, probe_batches
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, leaves, map_batch, move_to_device, storages

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES = 4
MIN_POSITIONS = 8
MOVED = 1e-4  # of the output's largest value: a sample's output moved
SAME = 1e-6  # of the tensor's largest value: rows this close are the same output


def varies(tensor: Any, size: int) -> bool | None:
    """Whether the rows of a per-sample tensor (batch axis of ``size``) differ; None when
    it has no such axis (or holds non-finite values)."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.is_complex():
        return None
    axis = batch_axis(tensor, size)
    if axis is None:
        return None
    if not tensor.is_floating_point():  # token ids, masks: exact
        rows = tensor.detach().movedim(axis, 0).reshape(size, -1)
        return bool((rows != rows[0]).any())
    rows = tensor.detach().float().movedim(axis, 0).reshape(size, -1)
    if not bool(torch.isfinite(rows).all()):
        return None
    scale = float(rows.abs().max().clamp_min(1e-12))
    return bool(((rows - rows[0]).abs() > SAME * scale).any())


# Where the samples' differences are lost: (the module's name, the module, (the shape and the
# largest magnitude of its floating input) or None).
Lost = tuple[str, nn.Module, "tuple[tuple[int, ...], float] | None"]

# The largest value of a layer input that counts as zero everywhere (a mean over a LayerNorm's
# features is 0 up to float rounding, about 1e-8).
NEAR_ZERO = 1e-5


def _any_varies(value: Any, size: int) -> bool | None:
    verdicts = [v for leaf in leaves(value) if (v := varies(leaf, size)) is not None]
    return any(verdicts) if verdicts else None



def _lost_in_frozen_layer(ctx: PreflightContext, batch: Any, leaf: torch.Tensor, changed: torch.Tensor | None) -> bool:
    """Whether the first layer whose input the change reaches and whose output it does not move
    has only frozen parameters: the span is dropped by a front end that does not train."""
    if changed is None:
        return False
    layers = [(name, module) for name, module in ctx.model.named_modules()
              if name and next(module.parameters(recurse=False), None) is not None]
    if not layers:
        return False

    def record(calls: list) -> list:
        return [module.register_forward_hook(
            lambda m, args, out, name=name: calls.append((name, [a.detach().clone() for a in args
                                                                 if isinstance(a, torch.Tensor)],
                                                          out.detach().clone() if isinstance(out, torch.Tensor) else None)))
            for name, module in layers]

    runs: list[list] = []
    for value in (leaf, changed):
        calls: list = []
        handles = record(calls)
        try:
            model_outputs(ctx, map_batch(lambda v, target=leaf, new=value: new if v is target else v, batch))
        finally:
            for handle in handles:
                handle.remove()
        runs.append(calls)
    modules = dict(layers)
    for (name, inputs, output), (other, inputs2, output2) in zip(runs[0], runs[1], strict=False):
        if name != other or output is None or output2 is None or output.shape != output2.shape:
            return False
        moved_in = any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(inputs, inputs2, strict=False))
        if moved_in and torch.equal(output, output2):
            return not any(p.requires_grad for p in modules[name].parameters())
    return False

class InputDependenceCheck(Check):
    """MODEL_IGNORES_INPUT: every sample of a batch gets the same output."""

    name = "step.input_dependence"
    stage = Stage.STEP
    codes = ("MODEL_IGNORES_INPUT", "MODEL_IGNORES_POSITIONS")

    def __init__(self) -> None:
        super().__init__()
        self._model_reads: set[int] = set()  # storages of the tensors the model's forward received
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        size = getattr(ctx.train_loader, "batch_size", None) or batch_size_of(batch)
        if not size or size < MIN_SAMPLES:
            findings.data["summary"] = "batch too small to probe"
            return
        keep = min(size, PROBE_SAMPLES)
        probe, _ = probe_batches(batch, size, keep)
        probe = move_to_device(probe, ctx.device)  # once: the storages the model reads are these
        if not _any_varies(probe, keep):
            findings.data["summary"] = "the samples of the batch do not differ"
            return
        trace = self._trace(ctx, probe, keep)
        if trace is None:
            findings.data["summary"] = "the forward could not be observed, or the model's inputs do not differ"
            return
        output_varies, lost_at = trace
        findings.data["summary"] = "outputs differ between samples" if output_varies is not False else \
            "every sample gets the same output"
        if output_varies is not False:
            if output_varies:
                self._positions(ctx, probe, keep, findings)
            return
        renormalised = lost_at is not None and getattr(lost_at[1], "max_norm", None) is not None
        if lost_at is not None and isinstance(lost_at[1], (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)) \
                and not renormalised and not bool(lost_at[1].weight.detach().any()):
            findings.data["summary"] = f"the zero-initialised {lost_at[0]!r} gives every sample its bias"
            return
        where = (f" The samples' differences are lost at {type(lost_at[1]).__name__} '{lost_at[0]}': its input "
                 "differs between samples and its output does not") if lost_at is not None else \
            " No module's output differed between samples: the forward does not use what differs in the batch"
        norm = lost_at[1] if lost_at is not None else None
        if isinstance(norm, (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)) \
                and isinstance(getattr(norm, "weight", None), torch.Tensor) and not bool(norm.weight.detach().any()):
            zeroed = [name for name, module in ctx.model.named_modules()
                      if isinstance(module, type(norm)) and isinstance(module.weight, torch.Tensor)
                      and not bool(module.weight.detach().any())]
            findings.error(
                "MODEL_IGNORES_INPUT",
                f"the model gives the same output to all {keep} samples of the first batch (eval mode, no gradients), "
                f"although the samples differ.{where}: its scale (gamma, .weight) is all zeros, so it outputs its bias "
                f"for every input, and {len(zeroed)} {type(norm).__name__} layer(s) are built that way "
                f"({', '.join(zeroed[:4])}). Zero-initialising the last norm of each residual branch "
                "(zero_init_residual) makes a ResNet block start as the identity, but only through its skip "
                "connection: applied to every norm, or in a network without residual connections, it cuts the "
                "signal and the gradient of every layer before it",
                "Zero only the last norm's weight inside each residual branch (the skip carries the signal), or keep "
                "the default gamma = 1: nn.init.ones_(m.weight) for the other norms.",
            )
            return
        received = lost_at[2] if lost_at is not None else None
        if lost_at is not None and isinstance(lost_at[1], (nn.Linear, nn.LazyLinear)) and received is not None \
                and received[1] < NEAR_ZERO and any(isinstance(m, nn.LayerNorm) for m in ctx.model.modules()):
            findings.error(
                "MODEL_IGNORES_INPUT",
                f"the model gives the same output to all {keep} samples of the first batch (eval mode, no gradients), "
                f"although the samples differ.{where}: what it receives, {received[0]}, is zero everywhere (at most "
                f"{received[1]:.1e}). A mean over the feature dimension of a LayerNorm's output is that: LayerNorm "
                "makes every token's mean over d_model 0, so h.mean(dim=-1) (Keras' axis=-1) of (B, T, d_model) "
                "averages the model dimension away and keeps T numbers that carry nothing (an nn.LazyLinear head "
                "then silently takes T inputs)",
                "Pool over the sequence, not the features: h.mean(dim=1) of (B, T, d_model) (or a [CLS] position, "
                "masked for padding), and give the head in_features=d_model explicitly instead of a LazyLinear.",
            )
            return
        if renormalised and isinstance(lost_at[1], (nn.Embedding, nn.EmbeddingBag)):
            max_norm = lost_at[1].max_norm
            findings.error(
                "MODEL_IGNORES_INPUT",
                f"the model gives the same output to all {keep} samples of the first batch (eval mode, no gradients), "
                f"although the samples differ.{where}: it was built with max_norm={max_norm}, so every row it looks up "
                f"is renormalised in place to norm at most {max_norm} on each forward; at that size the token vectors "
                "carry nothing and every update to them is undone at the next lookup. A config's 0.0 meant as 'no "
                "constraint' does this",
                f"Build the embedding with max_norm=None (no renormalisation), or a norm the vectors can live at "
                f"(e.g. 1.0 or more); check the config value that reached {lost_at[0]!r}.",
            )
            return
        findings.error(
            "MODEL_IGNORES_INPUT",
            f"the model gives the same output to all {keep} samples of the first batch (eval mode, no gradients), "
            f"although the samples differ: nothing it learns can depend on the input, and the loss can only fall to "
            f"the label prior.{where}",
            "Look there for what throws the input away: a forward that reads another tensor than its argument, an "
            "input multiplied by a zeroed mask, an attention mask that hides every token, or units that are all dead "
            "(a ReLU after a large negative bias or a bad init): re-initialise them or use a leaky activation.",
        )

    def _positions(self, ctx: PreflightContext, batch: Any, size: int, findings: Findings) -> None:
        base = model_outputs(ctx, batch)
        if base is None:
            return
        for leaf in leaves(batch):
            # Only what the model reads: the targets of the batch are the loss's business.
            recurrent = any(isinstance(m, nn.RNNBase) for m in ctx.model.modules())
            axis = _sequence_axis(leaf, size, sequential=recurrent or any(isinstance(m, nn.Conv1d)
                                                                         for m in ctx.model.modules()))
            # (B, T) float windows of a convolution-only model were columns before Conv1d counted:
            # only the field that runs past the window is judged there.
            field_only = axis is not None and not recurrent and leaf.dim() == 2 and leaf.is_floating_point()
            if axis is None or leaf.untyped_storage().data_ptr() not in self._model_reads:
                continue
            length = leaf.shape[axis]
            # The control the warning claims: swapping the whole sequence moves the outputs. Labels an
            # HF model receives beside its inputs reach only the loss, never the per-sample outputs.
            whole = _swap_span(leaf, axis, 0, length)
            if whole is None:
                continue
            output = model_outputs(ctx, map_batch(lambda value, target=leaf, new=whole: new if value is target else value,
                                                  batch))
            if output is None:
                return
            if not _samples_moved(base, output, size):
                continue
            if self._order_blind(ctx, batch, base, leaf, axis, size, findings):
                return
            # Halves first; then the first and the last quarter (a pooling window that stops short of the end).
            for spans in ((("first half", 0, length // 2), ("second half", length // 2, length)),
                          (("first quarter", 0, length // 4), ("last quarter", length - length // 4, length))):
                moved = {}
                for name, begin, stop in spans:
                    changed = _swap_span(leaf, axis, begin, stop)
                    if changed is None:
                        continue
                    swapped = map_batch(lambda value, target=leaf, new=changed: new if value is target else value, batch)
                    output = model_outputs(ctx, swapped)
                    if output is None:
                        return
                    moved[(name, begin, stop)] = _samples_moved(base, output, size)
                ignored = [span for span, count in moved.items() if count == 0]
                if len(ignored) != 1:
                    continue
                name, begin, stop = ignored[0]
                if _gradient_reaches(ctx, batch, leaf, axis, begin, stop):
                    # A path exists, its effect only too small to see: an untrained gated RNN forgets the
                    # start of a long sequence by its last state, which training changes. No path (out[:, 0]
                    # of a forward RNN, a slice, a pooling window) is what the read-out structurally cannot see.
                    continue
                if _lost_in_frozen_layer(ctx, batch, leaf, _swap_span(leaf, axis, begin, stop)):
                    # A frozen, loaded front end whose weights do not read that span (a pretrained
                    # filter bank over some bands only): its design, which training cannot change.
                    findings.data["ignored_in_frozen_layer"] = name
                    return
                if begin == 0 and leaf.is_floating_point() and padded_conv_forecaster(ctx):
                    reached = _positions_reached(ctx, batch, leaf, axis)
                    field = receptive_field(ctx.model)
                    reach = trailing_reach(reached) if reached is not None else None
                    findings.data.update(reach=reach, receptive_field=field)
                    if reach is not None and reach <= FIELD_SHORT * field:
                        self._report_field_past_window(leaf, reach, field, findings)
                        return
                if field_only:
                    return
                if begin == 0 and leaf.is_floating_point() and recent_window_forecaster(ctx):
                    findings.info(
                        "MODEL_IGNORES_POSITIONS",
                        f"the output depends on the recent part of each {tuple(leaf.shape)} window only (positions "
                        f"{begin}-{stop - 1} move no output): a convolution stack's receptive field, shorter than the "
                        "window, in a regression over the most recent inputs, which is a forecaster's design choice",
                        "If the oldest steps should count, add layers or dilation until the receptive field covers "
                        "the window; otherwise a shorter window trains faster.",
                    )
                    return
                self._report(leaf, axis, name, begin, stop, findings)
                return

    @staticmethod
    def _order_blind(ctx: PreflightContext, batch: Any, base: list[torch.Tensor], leaf: torch.Tensor, axis: int,
                     size: int, findings: Findings) -> bool:
        """MODEL_IGNORES_POSITIONS for order: an attention model whose output does not change when
        every sequence is reversed (its content does move it), so no position reaches the output."""
        attention = [name for name, module in ctx.model.named_modules()
                     if isinstance(module, (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))]
        if not attention:
            return False
        reversed_leaf = _reversed_valid(leaf, axis)
        if reversed_leaf is None:
            return False
        output = model_outputs(ctx, map_batch(lambda value: reversed_leaf if value is leaf else value, batch))
        if output is None or _samples_moved(base, output, size) != 0:
            return False
        tables = positional_tables(ctx.model)
        if tables and learned_from_zero(tables, ctx.optimizer):
            findings.data["summary"] = "order-blind at step 0: the learned position table starts at zeros"
            return False
        if not tables and unordered_elements(leaf, axis):
            findings.data["summary"] = "order-blind by design: the elements along the axis form a set"
            return False
        positional = [name for name, _ in tables]
        had = (f" although it holds a positional table ({', '.join(positional[:2])}), which never reaches the tokens "
               "as positions" if positional else ", and it holds no positional encoding at all")
        findings.data["summary"] = "the output does not depend on the order of the tokens"
        findings.warning(
            "MODEL_IGNORES_POSITIONS",
            f"the model's output does not depend on the order of its {tuple(leaf.shape)} input: reversing every "
            f"sequence moved no sample's output (eval mode), while another sample's sequence does move it. Attention "
            f"({attention[0]}) is order-blind by itself{had}. The tutorial PositionalEncoding, a (max_len, 1, d_model) "
            "table added as pe[:x.size(0)], indexes by the batch on batch_first (batch, seq, d_model) input: each "
            "sample gets one position's vector on every token, so word order never reaches the model",
            "Add the encoding along the sequence: x + pe[: x.size(1)].transpose(0, 1) (a (1, seq, d_model) slice) for "
            "batch_first input, or an nn.Embedding(max_len, d_model) of torch.arange(x.size(1)); check that "
            "reversing a sequence changes the output.",
        )
        return True

    @staticmethod
    def _report(leaf: torch.Tensor, axis: int, name: str, begin: int, stop: int, findings: Findings) -> None:
        span = f"{begin}-{stop - 1}"
        findings.data["ignored_positions"] = span
        where = "" if axis == 1 else f" (positions along dim {axis}, the channels-first layout)"
        findings.warning(
            "MODEL_IGNORES_POSITIONS",
            f"the model's output ignores the {name} of each sequence: replacing positions {span} of the "
            f"{tuple(leaf.shape)} input{where} with another sample's moved no sample's output (eval mode), and no "
            "gradient reaches them, while the rest does move it. Usually the read-out takes the wrong time step: "
            "out[:, 0] of a unidirectional RNN is the state after the first token only (out[:, -1], or h_n, sees the "
            "whole sequence); or a slice or pooling window stops short of the sequence (max_pool1d(h, h.size(1)) on "
            "(B, C, T) uses the channel count as the window; a causal Conv1d padded on both ends without trimming "
            "shifts the last position's receptive field past the input; a convolution stack whose receptive field "
            "is shorter than the sequence)",
            "Read out a state that has seen the whole sequence: h_n (with pack_padded_sequence for padded "
            "batches), out[:, -1] of a unidirectional RNN on unpadded input, a pooled mean or max over the valid "
            "positions (h.amax(dim=-1) for (B, C, T)), or a [CLS] position of a bidirectional encoder; trim a causal "
            "convolution's right padding (Chomp1d: out[..., :-padding]).",
        )

    @staticmethod
    def _report_field_past_window(leaf: torch.Tensor, reach: int, field: int, findings: Findings) -> None:
        findings.warning(
            "MODEL_IGNORES_POSITIONS",
            f"the output depends on the last {reach} position(s) of each {tuple(leaf.shape)} window only (the rest "
            f"move no output and get no gradient), though the convolutions' receptive field spans {field}: the field "
            "reaches past the end of the window into zero padding. A causal Conv1d padded on both ends "
            "(padding=(k - 1) * dilation) and then trimmed at the start (y[..., pad:]) instead of the end "
            "(y[..., :-pad]), or never trimmed, shifts every output's field forward, so the last output, the one "
            "read for the forecast, sees the last input and padding instead of the window before it",
            "Trim the causal padding from the end: y = conv(x)[..., :-pad] (Chomp1d), or pad on the left only: "
            "F.pad(x, (pad, 0)) before a Conv1d with padding=0.",
        )

    def _trace(self, ctx: PreflightContext, batch: Any, size: int) -> tuple[bool | None, Lost | None] | None:
        """(whether the model's output differs between samples, the first module that loses
        the differences); None when the forward cannot be observed or the model's own inputs
        do not differ (identical samples are the data checks' finding)."""
        names = {module: name or type(module).__name__ for name, module in ctx.model.named_modules()}
        lost: list[Lost] = []
        top: list[tuple[bool | None, Any]] = []
        read = self._model_reads
        read.clear()

        def on_forward(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            inputs_vary = _any_varies((args, kwargs), size)
            if module is ctx.model:
                if not top:
                    top.append((inputs_vary, output))
                    read.update(storages((args, kwargs)))
                return
            if not lost and inputs_vary and _any_varies(output, size) is False:
                first = next((a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
                received = (tuple(first.shape), float(first.detach().abs().max())) if first is not None else None
                lost.append((names[module], module, received))

        handles = [module.register_forward_hook(on_forward, with_kwargs=True) for module in names]
        try:
            eval_forward(ctx, batch)
        except Exception:
            return None
        finally:
            for handle in handles:
                handle.remove()
        if not top or not top[0][0]:
            return None
        return _any_varies(top[0][1], size), (lost[0] if lost else None)

def _gradient_reaches(ctx: PreflightContext, batch: Any, leaf: torch.Tensor, axis: int, begin: int, stop: int) -> bool:
    """Whether the model's output has a non-zero gradient with respect to positions
    ``begin:stop`` (along ``axis``) of ``leaf`` (through the embeddings that read it, for token
    ids); False only when no gradient path exists: a backward that fails says nothing about
    the path, so it counts as one (the warning claims that no gradient reaches the span)."""
    reached = _positions_reached(ctx, batch, leaf, axis)
    return reached is None or bool(reached[begin:stop].any())


def _positions_reached(ctx: PreflightContext, batch: Any, leaf: torch.Tensor, axis: int) -> torch.Tensor | None:
    """Per position along ``axis``: whether the model's output has a non-zero gradient with
    respect to it (for any sample); None when the backward cannot be taken."""
    watched: list[torch.Tensor] = []
    handles = []
    if leaf.is_floating_point():
        probe = leaf.detach().clone().requires_grad_(True)
        watched.append(probe)
        batch = map_batch(lambda value: probe if value is leaf else value, batch)
    else:
        storage = leaf.untyped_storage().data_ptr()

        def keep(module: nn.Module, args: tuple, output: Any) -> None:
            if args and isinstance(args[0], torch.Tensor) and args[0].untyped_storage().data_ptr() == storage \
                    and isinstance(output, torch.Tensor) and output.requires_grad and output.shape[:2] == leaf.shape[:2]:
                watched.append(output)

        handles = [module.register_forward_hook(keep) for module in ctx.model.modules()
                   if isinstance(module, (nn.Embedding, nn.EmbeddingBag))]
    outputs: list[Any] = []
    top = ctx.model.register_forward_hook(lambda module, args, output: outputs.append(output) if not outputs else None)
    try:
        # The backward runs before the state is put back: restoring the weights in place would
        # invalidate the graph.
        # cuDNN's RNN kernels refuse a backward in eval mode; the native ones give the same gradients
        with preserved_training_state(ctx), torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
            ctx.model.eval()
            with ctx.training.plan.autocast():
                ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))
            scores = [t.float().sum() for t in leaves(outputs[:1]) if isinstance(t, torch.Tensor) and t.requires_grad
                      and t.is_floating_point()]
            if not scores or not watched:
                return torch.zeros(leaf.shape[axis], dtype=torch.bool)
            grads = torch.autograd.grad(torch.stack(scores).sum(), watched, allow_unused=True)
    except Exception:
        return None
    finally:
        top.remove()
        for handle in handles:
            handle.remove()
    reached = torch.zeros(leaf.shape[axis], dtype=torch.bool)
    for grad in grads:
        if grad is not None:
            other = [dim for dim in range(grad.dim()) if dim != axis]
            reached |= (grad != 0).any(dim=other).cpu() if other else (grad != 0).cpu()
    return reached


def _sequence_axis(leaf: Any, size: int, sequential: bool = False) -> int | None:
    """The positions' axis of a sequence input: dim 1 of (B, T) token ids or (B, T, F) features,
    dim 2 of channels-first (B, C, T) features whose dim 1 is too short to be positions; dim 1 of
    (B, T) float windows of a univariate series when a recurrent module or a temporal convolution
    will read them (in a model without one, (B, D) floats are a table's columns)."""
    if sequential and isinstance(leaf, torch.Tensor) and leaf.dim() == 2 and leaf.shape[:1] == (size,) \
            and leaf.is_floating_point() and leaf.shape[1] >= MIN_POSITIONS:
        return 1
    if not isinstance(leaf, torch.Tensor) or leaf.shape[:1] != (size,) or leaf.dim() not in (2, 3):
        return None
    if leaf.dim() == 3:
        if not leaf.is_floating_point():
            return None
        if leaf.shape[1] >= MIN_POSITIONS:
            return 1
        return 2 if leaf.shape[2] >= MIN_POSITIONS else None
    if leaf.shape[1] < MIN_POSITIONS:
        return None
    # token ids; a 0/1 attention mask is not one
    if leaf.is_floating_point() or leaf.dtype == torch.bool or bool(((leaf == 0) | (leaf == 1)).all()):
        return None
    return 1


def _swap_span(leaf: torch.Tensor, axis: int, begin: int, stop: int) -> torch.Tensor | None:
    """``leaf`` with its non-padding positions ``begin:stop`` (along ``axis``) taken from the next sample."""
    moved = leaf.movedim(axis, 1)
    valid = torch.ones(moved.shape[:2], dtype=torch.bool, device=leaf.device)
    if not leaf.is_floating_point():
        _, pad = edge_padding(moved, None)
        if pad is not None:
            valid = ~pad
    donor = moved.roll(1, dims=0)
    donor_valid = valid.roll(1, dims=0)
    swap = torch.zeros_like(valid)
    swap[:, begin:stop] = valid[:, begin:stop] & donor_valid[:, begin:stop]
    mask = swap if moved.dim() == 2 else swap.unsqueeze(-1)
    changed = torch.where(mask, donor, moved).movedim(1, axis)
    return changed if not torch.equal(changed, leaf) else None


SEQUENCE_MODULES = (nn.RNNBase, nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
FORECAST_CRITERIA = tuple(name for name in REGRESSION_CRITERIA if name != "kl_div")  # kl_div fits distributions


def recent_window_forecaster(ctx: PreflightContext) -> bool:
    """A model with no recurrence or attention and no Conv1d padded on both ends (its reach
    along the sequence is a receptive field in the past, set on purpose) trained by regression
    criteria only: a forecaster that
    reads the recent steps of its window. A read-out at the wrong step of an RNN, or a
    sequence classifier whose evidence may sit anywhere, is not one."""
    if any(isinstance(module, SEQUENCE_MODULES) for module in ctx.model.modules()):
        return False
    # Padding built into a Conv1d pads both ends, so a read-out of the last steps reaches past
    # the input by half its field: the un-chomped causal convolution, a bug in a forecaster too.
    if any(isinstance(module, nn.Conv1d) and module.padding not in ((0,), "valid") for module in ctx.model.modules()):
        return False
    calls = [call for call in get_probe(ctx).criterion_calls if call.error is None]
    return bool(calls) and all(call.function in FORECAST_CRITERIA for call in calls)


FIELD_SHORT = 0.5  # of the convolutions' receptive field: a reach this short runs past the window


def padded_conv_forecaster(ctx: PreflightContext) -> bool:
    """A regression model with no recurrence or attention whose Conv1d layers pad both ends: a
    temporal convolution network, chomped (its field in the past) or not."""
    if any(isinstance(module, SEQUENCE_MODULES) for module in ctx.model.modules()):
        return False
    convs = [module for module in ctx.model.modules() if isinstance(module, nn.Conv1d)]
    if not convs or all(module.padding in ((0,), "valid") for module in convs):
        return False
    calls = [call for call in get_probe(ctx).criterion_calls if call.error is None]
    return bool(calls) and all(call.function in FORECAST_CRITERIA for call in calls)


def receptive_field(model: nn.Module) -> int:
    """1 + sum of (kernel - 1) * dilation over the model's Conv1d layers: a stack's field."""
    return 1 + sum((module.kernel_size[0] - 1) * module.dilation[0] for module in model.modules()
                   if isinstance(module, nn.Conv1d))


def trailing_reach(reached: torch.Tensor) -> int:
    """How many positions at the end of the window the output depends on, counted back from
    the last one it reads."""
    positions = reached.nonzero().flatten()
    return 0 if not positions.numel() else int(positions[-1] - positions[0]) + 1


def positional_tables(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The buffers and parameters named as position tables (``pe``, ``pos_embedding``, ...)."""
    return [(name, tensor) for name, tensor in [*model.named_buffers(), *model.named_parameters()]
            if any(part == "pe" or part.startswith("pos") for part in re.split(r"[._]", name.lower()))]


def learned_from_zero(tables: list[tuple[str, torch.Tensor]], optimizer: Any) -> bool:
    """Every position table is a zero parameter the optimizer trains: order-blind at step 0
    only, since each position's rows get their own gradient from the first step (a frozen
    zero table is FROZEN_AT_ZERO and stays order-blind, so it is not this)."""
    trained = {id(p) for group in getattr(optimizer, "param_groups", ()) for p in group["params"]}
    return all(isinstance(tensor, nn.Parameter) and tensor.requires_grad and id(tensor) in trained
               and not bool(tensor.detach().any()) for _, tensor in tables)


SET_LIKE = 0.9  # neighbours' distance over random pairs' within a sample: no order in the data


def unordered_elements(leaf: torch.Tensor, axis: int) -> bool:
    """Whether the float elements along ``axis`` are a set, not a sequence: neighbours are no
    more alike than two elements drawn at random from the same sample (points, detections,
    a bag of feature vectors), so an order-blind model (Deep Sets, attention pooling by a
    seed query) is the design. Signals, frames and trajectories have close neighbours. Token
    ids say nothing by distance and always count as a sequence."""
    if not leaf.is_floating_point() or leaf.dim() < 2:
        return False
    elements = leaf.detach().float().movedim(axis, 1)
    elements = elements.reshape(elements.shape[0], elements.shape[1], -1)
    count = elements.shape[1]
    if count < 4 or not bool(torch.isfinite(elements).all()):
        return False
    neighbours = (elements[:, 1:] - elements[:, :-1]).norm(dim=-1).mean()
    shuffled = torch.randperm(count, generator=torch.Generator().manual_seed(0))
    pairs = (elements[:, shuffled] - elements).norm(dim=-1)
    apart = pairs[:, shuffled != torch.arange(count)].mean()
    return float(apart) > 0 and float(neighbours / apart) >= SET_LIKE


def _reversed_valid(leaf: torch.Tensor, axis: int) -> torch.Tensor | None:
    """``leaf`` with each sample's non-padding positions (along ``axis``) in reverse order."""
    moved = leaf.movedim(axis, 1)
    if not leaf.is_floating_point():
        _, pad = edge_padding(moved, None)
        if pad is not None and bool(pad.any()):
            return None  # padded rows: reversing moves the padding, which the mask does not follow
    flipped = moved.flip(1).movedim(1, axis)
    return flipped if not torch.equal(flipped, leaf) else None


def _samples_moved(first: list[torch.Tensor], second: list[torch.Tensor], size: int) -> int | None:
    moved = None
    for a, b in zip(first, second, strict=False):
        if a.shape != b.shape or not a.is_floating_point():
            continue
        axis = batch_axis(a, size)
        if axis is None:
            continue
        tolerance = MOVED * float(a.abs().max().clamp_min(1e-12))
        rows = ((a.float() - b.float()).abs() > tolerance).movedim(axis, 0).reshape(size, -1).any(dim=1)
        moved = (moved or 0) + int(rows.sum())
    return moved
