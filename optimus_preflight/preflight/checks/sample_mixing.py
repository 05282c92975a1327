"""Samples of a batch that reach each other's outputs (``step.sample_mixing``).

A model computes each sample's output from that sample alone (in eval mode: no dropout,
BatchNorm on its running statistics). When it does not, the batch axis is being read as
another axis: a ``(B, T, ...)`` batch into a module built with ``batch_first=False`` (its
attention or recurrence runs across the sentences of the batch), a time-major batch into
a ``batch_first=True`` one, a softmax or a mean over dim 0. Shapes cannot tell these apart
when the batch size equals the sequence length; the outputs can.

The probe: one forward of the first samples of the first batch in eval mode without
gradients, then a second with sample 0 replaced by sample 1 (a real sample, so token ids
and masks stay valid). Only sample 0's outputs may move; when most of the output moves,
the samples are mixed. The batch axis of each input is dim 0 (the default collate's), else
the first of the loader's batch size.

Most of the output moving is a batch axis read as another axis. A few other samples moving
is a per-sample tensor handed to the wrong samples: a ``(B, T, T)`` mask tiled to
``(B*heads, T, T)`` with ``repeat`` (head-major) where ``nn.MultiheadAttention`` reads
``b*heads + h``. Then the samples that move are evenly spaced, every ``B/gcd(B, heads)``-th.
An output's sample axis is the axis of the probe's size along which only index 0 moved when
there is one, so a time axis as long as the probe never passes for it. An output that scores
every pair of samples, (B, B) logits of a contrastive model, moves exactly in the changed
sample's row and column: it is left out, its coupling is the point. One other sample moving
is reported when a second probe (sample 2 changed) moves one other sample too: a flip or a
shift over the batch axis pairs every sample with another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_forward, model_call, model_outputs
from optimus_preflight.preflight.analyses.mixing_op import MixingOp, first_mixing, record_calls
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of, map_batch

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES = 4  # fewer: one sample is too large a share of the output to tell
MIXED_SHARE = 0.5  # of the output's elements moved by changing one sample
PROBE_SAMPLES = 16
OTHERS_MOVED = 2  # other samples whose outputs moved: one could be a numerical accident
CONFIRMING_OTHERS = 4  # a second probe moving a few others confirms a first that moved one
OTHER_SAMPLE_TOL = 1e-3  # of the output's largest value: a sample's move, far above float noise


def batch_axis(tensor: torch.Tensor, size: int) -> int | None:
    if tensor.dim() == 0 or tensor.layout != torch.strided:  # a sparse adjacency is no per-sample tensor
        return None
    if tensor.shape[0] == size:
        return 0
    return next((dim for dim, length in enumerate(tensor.shape) if length == size), None)


def probe_batches(batch: Any, size: int, keep: int, index: int = 0) -> tuple[Any, Any]:
    """The first ``keep`` samples of ``batch``, and the same with sample ``index`` a copy of the next.
    Each tensor's batch axis is found once, on the full batch: after the cut, a time axis as
    long as ``keep`` (16 positions of 16 samples) would pass for it."""
    def cut(tensor: torch.Tensor, replace: bool) -> torch.Tensor:
        axis = batch_axis(tensor, size)
        if axis is None:
            return tensor
        kept = tensor.narrow(axis, 0, keep)
        if not replace:
            return kept
        changed = kept.clone()
        changed.select(axis, index).copy_(kept.select(axis, index + 1))
        return changed

    def probe(replace: bool) -> Any:
        return map_batch(lambda leaf: cut(leaf, replace) if isinstance(leaf, torch.Tensor) else leaf, batch)

    return probe(False), probe(True)


def pairwise(changed: torch.Tensor, keep: int, index: int) -> bool:
    """Whether ``changed`` (elements that moved) lies within the row and the column of the
    changed sample on two sample axes: a (B, B) score of every pair (CLIP logits, a distance
    matrix), where pairs with that sample are meant to move."""
    axes = [dim for dim, length in enumerate(changed.shape) if length == keep]
    for position, first in enumerate(axes):
        for second in axes[position + 1:]:
            row, column = torch.zeros_like(changed), torch.zeros_like(changed)
            row.narrow(first, index, 1).fill_(True)
            column.narrow(second, index, 1).fill_(True)
            if (bool((changed & ~row).any()) and bool((changed & ~column).any())
                    and not bool((changed & ~(row | column)).any())):
                return True
    return False


def per_sample_pairs(first: list[torch.Tensor], second: list[torch.Tensor], keep: int,
                     index: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The outputs without the pairwise ones (see ``pairwise``)."""
    kept_first, kept_second = [], []
    for a, b in zip(first, second):
        if a.shape == b.shape and a.dim() >= 2 and a.is_floating_point():
            tolerance = OTHER_SAMPLE_TOL * float(a.float().abs().max().clamp_min(1e-12))
            if pairwise((a.float() - b.float()).abs() > tolerance, keep, index):
                continue
        kept_first.append(a)
        kept_second.append(b)
    return kept_first, kept_second


def moved_share(first: list[torch.Tensor], second: list[torch.Tensor]) -> float | None:
    """The share of output elements that differ between two forwards (per-sample outputs only)."""
    moved = total = 0
    for a, b in zip(first, second):
        if a.shape != b.shape or a.dim() == 0 or not a.is_floating_point():
            continue
        a, b = a.float(), b.float()
        tolerance = 1e-4 * float(a.abs().max().clamp_min(1e-12))
        moved += int(((a - b).abs() > tolerance).sum())
        total += a.numel()
    return moved / total if total else None


def other_samples_moved(first: list[torch.Tensor], second: list[torch.Tensor], keep: int,
                        index: int = 0) -> list[int] | None:
    """Indices of the samples other than 0 whose outputs moved; None when no output has an
    axis of ``keep`` samples. Per output, the axis that moved the fewest other samples is its
    sample axis: a time-major ``(T, B, H)`` output with ``T == keep`` moves every index of its
    time axis but only index 0 of its batch axis."""
    moved: set[int] = set()
    seen_axis = False
    for a, b in zip(first, second):
        if a.shape != b.shape or a.dim() == 0 or not a.is_floating_point():
            continue
        axes = [dim for dim, length in enumerate(a.shape) if length == keep]
        if not axes:
            continue
        seen_axis = True
        a, b = a.float(), b.float()
        tolerance = OTHER_SAMPLE_TOL * float(a.abs().max().clamp_min(1e-12))
        changed = (a - b).abs() > tolerance
        per_axis = []
        for axis in axes:
            rows = changed.movedim(axis, 0).reshape(keep, -1).any(dim=1)
            per_axis.append({int(i) for i in rows.nonzero().flatten().tolist() if i != index})
        moved |= min(per_axis, key=len)
    return sorted(moved) if seen_axis else None


def index_dependent(first: list[torch.Tensor], second: list[torch.Tensor], keep: int, index: int = 0) -> bool:
    """Whether sample ``index + 1``'s content gives another output at batch position ``index``
    (``second``, where sample ``index`` was replaced by it) than at its own (``first``): the
    output depends on where in the batch a sample sits."""
    for a, b in zip(first, second):
        if a.shape != b.shape or a.dim() == 0 or not a.is_floating_point():
            continue
        a, b = a.float(), b.float()
        tolerance = OTHER_SAMPLE_TOL * float(a.abs().max().clamp_min(1e-12))
        # The first axis as long as the probe is the samples'; a later one of that length (16 features
        # of 16 samples) is not, and comparing its entries would read features as positions.
        for axis in [dim for dim, length in enumerate(a.shape) if length == keep][:1]:
            changed = ((a - b).abs() > tolerance).movedim(axis, 0).reshape(keep, -1).any(dim=1)
            if bool(changed[:index].any()) or bool(changed[index + 1:].any()):
                continue  # not this tensor's sample axis (or samples mix: reported elsewhere)
            if bool(((b.select(axis, index) - a.select(axis, index + 1)).abs() > tolerance).any()):
                return True
    return False


def changed_rows(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> set[int]:
    moved = ((a.float() - b.float()).abs() > tolerance).reshape(a.shape[0], -1).any(dim=1)
    return {int(i) for i in moved.nonzero().flatten().tolist()}


def rows_follow_inputs(first: tuple[list[torch.Tensor], list[torch.Tensor]],
                       second: tuple[list[torch.Tensor], list[torch.Tensor]], keep: int, index: int = 0) -> bool:
    """Whether the model's first call is given the samples in a layout of the loss's own (two views
    stacked, torch.cat([v1, v2]); rows selected or gathered for pairs) and its outputs move only in
    the rows whose input moved: samples paired or stacked by the loss are not mixed by the model.
    A batch passed as it is (the changed sample in its own row 0 alone) is judged as before, and
    so is a time-major input, whose every row holds the changed sample."""
    (inputs, outputs), (inputs_again, outputs_again) = first, second
    if not inputs or not inputs_again or inputs[0].shape != inputs_again[0].shape:
        return False
    x, x_again = inputs[0], inputs_again[0]
    if x.layout != torch.strided:
        return False
    rows = x.shape[0]
    moved_in = changed_rows(x, x_again, 0.0)
    if not moved_in or len(moved_in) == rows or (rows == keep and moved_in == {index}):
        return False
    compared = False
    for a, b in zip(outputs, outputs_again):
        if a.shape != b.shape or a.shape[0] != rows or not a.is_floating_point() or a.layout != torch.strided:
            continue
        tolerance = OTHER_SAMPLE_TOL * float(a.float().abs().max().clamp_min(1e-12))
        if not changed_rows(a, b, tolerance) <= moved_in:
            return False
        compared = True
    return compared


def evenly_spaced(indices: list[int], keep: int) -> int | None:
    """The stride when ``indices`` are multiples of one stride that divides ``keep``: all of
    them, or all but some whose part of sample 0 happened to equal sample 1's (the probe's
    replacement), so that part of the tiled tensor did not change."""
    if len(indices) < 2:
        return None
    stride = indices[0]
    for index in indices:
        stride = math.gcd(stride, index)
    multiples = list(range(stride, keep, stride))
    return stride if stride > 1 and keep % stride == 0 and set(indices) <= set(multiples) \
        and 2 * len(indices) >= len(multiples) else None


def ordinal(n: int) -> str:
    return f"{n}{'nd' if n == 2 else 'rd' if n == 3 else 'th'}"


class SampleMixingCheck(Check):
    """BATCH_MIXING: one sample's input changes other samples' outputs."""

    name = "step.sample_mixing"
    stage = Stage.STEP
    codes = ("BATCH_MIXING", "BATCH_INDEX_DEPENDENT")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        size = getattr(ctx.train_loader, "batch_size", None) or batch_size_of(batch)
        if not size or size < MIN_SAMPLES:
            findings.data["summary"] = "batch too small to probe"
            return
        keep = min(size, PROBE_SAMPLES)
        probes = probe_batches(batch, size, keep)
        calls = [model_call(ctx, probe) for probe in probes]
        if calls[0] is None or calls[1] is None:
            findings.data["summary"] = "the forward could not be observed"
            return
        if rows_follow_inputs(calls[0], calls[1], keep):
            findings.data["summary"] = ("the loss lays the samples out anew for the model (views stacked, rows "
                                        "selected); its outputs move only in the rows whose input moved")
            return
        outputs = [calls[0][1], calls[1][1]]
        outputs = list(per_sample_pairs(*outputs, keep))
        share = moved_share(*outputs)
        if not share:  # sample 1 equals sample 0, or nothing per-sample came out
            findings.data["summary"] = "no per-sample output moved"
            return
        others = other_samples_moved(*outputs, keep)
        findings.data.update(samples=keep, moved_share=round(share, 4), other_samples_moved=others)
        findings.data["summary"] = f"changing sample 0 of {keep} moved {share:.0%} of the model's output"
        if share > MIXED_SHARE and share > 3 / keep:
            self._mixed(keep, share, findings, self._where(ctx, probes, keep, findings), transposed_list(batch, size))
        elif others is not None and len(others) >= OTHERS_MOVED:
            self._some_mixed(keep, others, findings, self._where(ctx, probes, keep, findings))
        elif others is not None and len(others) == 1 and (moved := self._one_other(ctx, batch, size, keep, others)):
            self._one_mixed(keep, moved, findings, self._where(ctx, probes, keep, findings))
        elif index_dependent(*outputs, keep) and not self._stochastic(ctx, probes[0], outputs[0]) \
                and self._position_confirmed(ctx, batch, size, keep):
            findings.warning(
                "BATCH_INDEX_DEPENDENT",
                "the same sample gives a different output at batch position 0 than at position 1 (eval mode, "
                "nothing else changed): the model adds something indexed by the batch position. Usually a "
                "positional encoding written for (T, B, D) inputs, x + pe[:x.size(0)] with pe of shape (max_len, 1, "
                "D), used in a batch_first model: sample b gets position b's encoding on all its tokens, and no "
                "token gets its own position",
                "Index the positional encoding by the sequence axis of a batch_first input: x + pe[:x.size(1)] "
                "with pe of shape (1, max_len, D) (or transpose the input to (T, B, D) first).",
            )

    @staticmethod
    def _where(ctx: PreflightContext, probes: tuple[Any, Any], keep: int, findings: Findings) -> MixingOp | None:
        """The operation where the samples first mix, from both probes' recorded calls."""
        calls = [record_calls(lambda probe=probe: eval_forward(ctx, probe)) for probe in probes]
        if calls[0] is None or calls[1] is None:
            return None
        op = first_mixing(calls[0], calls[1], keep)
        if op is not None:
            findings.data["mixing_op"] = {"name": op.name, "dim": op.dim, "input_shape": list(op.input_shape),
                                          "sample_axis": op.sample_axis, "frame": op.frame}
        return op

    @staticmethod
    def _located(op: MixingOp | None, cause: str, fix: str) -> tuple[str, str]:
        """The message's cause and the fix: the operation found and its own cause where known."""
        if op is None:
            return cause, fix
        known = op.cause()
        return (f"{op.describe()[0].upper()}{op.describe()[1:]}. {known[0] if known else cause}",
                known[1] if known else fix)

    @classmethod
    def _some_mixed(cls, keep: int, others: list[int], findings: Findings, op: MixingOp | None = None) -> None:
        stride = evenly_spaced(others, keep)
        listed = ", ".join(str(i) for i in others[:8]) + (", ..." if len(others) > 8 else "")
        if stride:
            parts = keep // stride
            cause = (f"The samples that moved are every {ordinal(stride)} of the batch: the signature of per-sample "
                     "tensors laid out batch-major and read back sample-major. Either k per-sample parts joined "
                     f"along the batch, torch.cat(parts, dim=0).view(B, -1) (with {parts} parts, row b of the view "
                     f"holds rows {parts}b..{parts}b+{parts - 1} of the stack: other samples' parts; per-field "
                     "embeddings of a tabular or recommender model), where torch.cat(parts, dim=1) was meant; or a "
                     "per-sample tensor tiled with .repeat(k, ...) where .repeat_interleave(k, dim=0) was meant, e.g. "
                     "a (B, T, T) attention mask expanded to (B*heads, T, T) head-major while nn.MultiheadAttention "
                     "reads index b*heads + h, so the heads of one sample get another sample's mask")
            fix = ("Join per-sample parts along the feature axis: torch.cat(parts, dim=1) (or torch.stack(parts, "
                   "dim=1).flatten(1)); tile per-sample tensors sample-major: mask.repeat_interleave(heads, dim=0), "
                   "or pass a (B, T) key_padding_mask instead of a 3-D attn_mask.")
        else:
            cause = ("Something in the forward hands one sample's tensor to other samples: a per-sample mask or "
                     "embedding tiled with .repeat where .repeat_interleave was meant (a (B*heads, T, T) attention "
                     "mask), a .view/.reshape that interleaves the batch with another axis (frames folded into the batch as (B*T, ...) and unfolded with .view(T, B, -1) where .view(B, T, -1) was meant, so each clip averages frames of other videos), a flat tensor folded back with its axes in the other order (per-query document scores flattened query by query and folded with .view(D, Q).t() where .view(Q, D) was meant: the transpose of a view is not the view of a transpose), or a statistic over the "
                     "batch")
            fix = ("Keep every per-sample tensor sample-major (repeat_interleave, key_padding_mask, permute before "
                   "reshape; fold a flat tensor back in the order it was flattened, view(Q, D), and transpose after). "
                   "If samples are meant to interact (a set model), disable the issue BATCH_MIXING.")
        cause, fix = cls._located(op, cause, fix)
        findings.warning(
            "BATCH_MIXING",
            f"changing sample 0 of a batch of {keep} (in eval mode, without gradients) also changed the outputs of "
            f"samples {listed}: their outputs depend on sample 0, so they read the wrong sample's data. {cause}",
            fix,
        )

    @classmethod
    def _one_other(cls, ctx: PreflightContext, batch: Any, size: int, keep: int,
                   others: list[int]) -> tuple[int, int] | None:
        """Where sample 0's and sample 2's data end up when each reaches exactly one other
        sample: (j for sample 0, j for sample 2), confirmed by the second probe, else None.
        One other sample moving is too rare an accident to ignore when it happens twice."""
        outputs = [cls._outputs(ctx, probe) for probe in probe_batches(batch, size, keep, index=2)]
        if outputs[0] is None or outputs[1] is None:
            return None
        outputs = list(per_sample_pairs(*outputs, keep, index=2))
        again = other_samples_moved(*outputs, keep, index=2)
        if not again or len(again) > CONFIRMING_OTHERS:
            return None
        return others[0], again[0] if len(again) == 1 else again

    @classmethod
    def _one_mixed(cls, keep: int, moved: tuple[int, int | list[int]], findings: Findings,
                   op: MixingOp | None = None) -> None:
        first, second = moved
        if isinstance(second, list):  # sample 2 reached several samples: rows regrouped across the batch
            listed = ", ".join(str(i) for i in second)
            cause, fix = cls._located(
                op, "A .view/.reshape regroups rows across the batch: torch.cat((u, v)) concatenates along dim 0 by "
                "default, (2B, d), and .view(-1, 2 * d) then pairs two users (or two items) in each row instead of "
                "a user with its own item",
                "Concatenate per-sample features along the feature axis: torch.cat((u, v), dim=1) (or dim=-1); "
                "never reshape across the batch axis.")
            findings.warning(
                "BATCH_MIXING",
                f"changing sample 0 of a batch of {keep} (eval mode, no gradients) moved the output of sample {first}, "
                f"and changing sample 2 moved samples {listed}: outputs are computed from other samples' data. "
                f"{cause}",
                fix,
            )
            return
        if first == keep - 1 and second == keep - 3:
            cause = ("The batch order is reversed: sample b's output reads sample B-1-b, a flip(0) / [::-1] meant "
                     "for the time axis of time-major (T, B) data applied to a batch_first (B, T) tensor")
            fix = "Reverse the time axis of a batch_first tensor: x.flip(1) (or flip(dims=[1])), not flip(0)."
        elif first == 1 and second == 3:
            cause = ("Each sample's output reads the sample before it in the batch: a difference, shift or roll "
                     "along dim 0 (torch.diff(x, dim=0), x[1:] - x[:-1], torch.roll(x, 1, 0)) written for one "
                     "(T, F) sequence and applied to a (B, T, F) batch, so it runs across samples, not time steps")
            fix = "Take the difference / shift along the time axis of the batch: torch.diff(x, dim=1), x[:, 1:] - x[:, :-1]."
        else:
            cause = (f"Sample 0's data reaches sample {first}'s output and sample 2's reaches sample {second}'s: an "
                     "index, flip, roll or shift over the batch axis that pairs each sample with another one")
            fix = "Apply per-sample operations along the sample's own axes (dim 1 and up of a batch), never dim 0."
        cause, fix = cls._located(op, cause, fix)
        findings.warning(
            "BATCH_MIXING",
            f"changing sample 0 of a batch of {keep} (eval mode, no gradients) moved the output of sample {first}, "
            f"and changing sample 2 moved sample {second}'s: each output is computed from another sample's data. "
            f"{cause}",
            fix,
        )

    @classmethod
    def _mixed(cls, keep: int, share: float, findings: Findings, op: MixingOp | None = None,
               listed: tuple[str, int, int] | None = None) -> None:
        if listed is not None:
            field, positions, size = listed
            findings.warning(
                "BATCH_MIXING",
                f"changing one sample of a batch of {keep} changes {share:.0%} of the model's outputs (only that "
                f"sample's share should move, in eval mode): the model mixes the samples of a batch. The batch's "
                f"{field} is a list of {positions} tensors of shape ({size},): the dataset's __getitem__ returns a "
                "Python list, and default_collate turns a batch of lists into one tensor per list position, so "
                f"torch.stack of it builds ({positions}, {size}), positions by samples, which a batch_first model reads "
                f"as {positions} sequences running across the samples",
                f"Return a tensor from __getitem__ (torch.tensor(items)) so default_collate stacks the samples on "
                f"dim 0, or stack the list along dim 1: torch.stack({field}, dim=1) gives "
                f"({size}, {positions}).",
            )
            return
        cause, fix = cls._located(
            op, "Usually the batch axis is read as another one: a (B, T, ...) batch into nn.TransformerEncoderLayer / "
            "nn.MultiheadAttention / nn.LSTM built without batch_first=True (attention or recurrence then runs "
            "across the batch), a time-major batch into a batch_first module, or a softmax/mean over dim 0",
            "Give sequence modules the layout of the batch (batch_first=True for (B, T, ...) batches, or "
            "x.transpose(0, 1) before them), and normalise over the feature or class dim, never dim 0. If "
            "samples are meant to interact (a set model), disable the issue BATCH_MIXING.")
        findings.warning(
            "BATCH_MIXING",
            f"changing one sample of a batch of {keep} changes {share:.0%} of the model's outputs (only that "
            f"sample's share should move, in eval mode): the model mixes the samples of a batch. {cause}",
            fix,
        )

    @classmethod
    def _stochastic(cls, ctx: PreflightContext, batch: Any, first: list[torch.Tensor]) -> bool:
        """Whether the eval-mode forward draws random numbers (a VAE's sampled latent): the same
        batch under another seed gives other outputs. Both probes ran from the same RNG state,
        so per-position noise looks like a dependence on the batch position."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(torch.initial_seed() + 1)
            again = cls._outputs(ctx, batch)
        if again is None:
            return True
        return any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(first, again))

    @classmethod
    def _position_confirmed(cls, ctx: PreflightContext, batch: Any, size: int, keep: int) -> bool:
        """The same dependence for another sample at another position (sample 3 at position 2): a
        near tie that one position's rounding flips (an argmin over distances a matrix product
        computed) moves one sample, a positional term indexed by the batch moves every one."""
        if keep < 4:
            return True
        probes = probe_batches(batch, size, keep, index=2)
        outputs = [cls._outputs(ctx, probe) for probe in probes]
        if outputs[0] is None or outputs[1] is None:
            return True
        return index_dependent(*per_sample_pairs(outputs[0], outputs[1], keep, index=2), keep, index=2)

    @staticmethod
    def _outputs(ctx: PreflightContext, batch: Any) -> list[torch.Tensor] | None:
        return model_outputs(ctx, batch)  # eval mode: no dropout, running BatchNorm statistics

def transposed_list(batch: Any, size: int) -> tuple[str, int, int] | None:
    """(field, positions, batch size) of a batch field that default_collate made from each
    sample's Python list: a list of 3 or more tensors of shape (batch size,), one per position."""
    if isinstance(batch, Mapping):
        fields = [(f"batch[{key!r}]", value) for key, value in batch.items()]
    elif isinstance(batch, (list, tuple)):
        fields = [(f"batch[{index}]", value) for index, value in enumerate(batch)]
    else:
        return None
    for name, value in fields:
        if isinstance(value, (list, tuple)) and len(value) >= 3 and all(
                isinstance(item, torch.Tensor) and item.dim() == 1 and item.shape[0] == size for item in value):
            return name, len(value), size
    return None
