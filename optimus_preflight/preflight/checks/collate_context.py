"""A collate function whose output for a sample depends on the other samples of its batch
(``data.collate_context``).

``COLLATE_DEPENDS_ON_BATCH``: categories label-encoded from the values present in each
batch (``{c: k for k, c in enumerate(sorted(set(names)))}`` inside ``collate_fn``), features
or targets standardised with the batch's own mean and std, ids remapped per batch. Shapes,
dtypes and ranges stay right; the same sample is a different input from step to step, and
validation batches are encoded differently again.

The test needs no knowledge of the collate: the same samples are collated as two halves and
as one batch. A collate that works sample by sample gives every row of a half somewhere in
the whole batch (up to padding: compared over the common width, aligned at the start or at
the end for left padding; in any order, so sorting collates pass). Tensors that change when
the same half is collated again under another seed (random masking, mixup) or that are the
same for both halves (positions, in-batch ``arange`` labels, constants) say nothing and are
left out, as are tensors whose first axis is not the batch (packed or flattened tokens). A
batch with soft (B, C) probability targets blends its samples on purpose (mixup, CutMix).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.collate_order import (
    NOT_CUSTOM_COLLATE,
    collate_seeded,
    custom_collate,
    disagreeing,
    is_offsets,
    leaf_names,
)
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SAMPLES = 16
MIN_SAMPLES = 8
MISSING = 0.25  # the share of a half's rows found nowhere in the whole batch that fires


def _window(tensor: torch.Tensor, shape: tuple[int, ...], *, from_end: bool) -> torch.Tensor:
    """The tensor cut to ``shape`` past the batch axis, from the start or from the end of each axis."""
    index = [slice(None)] + [slice(size - keep, size) if from_end else slice(0, keep)
                             for size, keep in zip(tensor.shape[1:], shape, strict=True)]
    return tensor[tuple(index)]


def _row_matches(half: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """(rows of ``half``, rows of ``whole``) bool: the rows are equal over their common width,
    aligned at the start or at the end (left padding)."""
    half, whole = half.detach().cpu(), whole.detach().cpu()
    shape = tuple(min(a, b) for a, b in zip(half.shape[1:], whole.shape[1:], strict=True))
    matches = torch.zeros(half.shape[0], whole.shape[0], dtype=torch.bool)
    for from_end in (False, True):
        a = _window(half, shape, from_end=from_end).reshape(half.shape[0], -1)
        b = _window(whole, shape, from_end=from_end).reshape(whole.shape[0], -1)
        if a.is_floating_point() or b.is_floating_point():
            a, b = torch.nan_to_num(a.double()), torch.nan_to_num(b.double())
            matches |= torch.isclose(a[:, None, :], b[None, :, :], rtol=1e-4, atol=1e-6).all(dim=-1)
        else:
            matches |= (a[:, None, :] == b[None, :, :]).all(dim=-1)
    return matches


def _same(a: Any, b: Any) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
        return False
    return bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) if a.is_floating_point() else torch.equal(a, b))


def batch_dependent(first: Any, first_again: Any, second: Any, whole: Any,
                    sizes: tuple[int, int]) -> tuple[list[int], float] | None:
    """The tensors to blame (indices in ``leaves`` order) and the share of the halves' samples
    (``sizes`` of them) whose rows, all tensors together, are nowhere in the whole batch; None
    when every sample is found (pure)."""
    per_leaf: dict[int, torch.Tensor] = {}
    for index, (a, again, b, w) in enumerate(zip(leaves(first), leaves(first_again), leaves(second), leaves(whole),
                                                 strict=False)):
        if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 and not t.is_complex() for t in (a, b, w)):
            continue
        if (a.shape[0], b.shape[0], w.shape[0]) != (*sizes, sum(sizes)) or not a.dim() == b.dim() == w.dim():
            continue
        if not _same(a, again) or _same(a, b) or is_offsets(w, whole):  # random, positional / constant, offsets
            continue
        per_leaf[index] = torch.cat([_row_matches(a, w), _row_matches(b, w)])
    if not per_leaf:
        return None

    def unmatched(indices: list[int]) -> int:
        joint = torch.stack([per_leaf[i] for i in indices]).all(dim=0) if indices else None
        return 0 if joint is None else int((~joint.any(dim=1)).sum())

    everything = list(per_leaf)
    missing = unmatched(everything)
    if missing < 2 or missing < MISSING * sum(sizes):
        return None
    # Blame the tensors whose removal explains most of the missing samples.
    relief = {i: missing - unmatched([j for j in everything if j != i]) for i in everything}
    best = max(relief.values())
    return [i for i in everything if relief[i] == best], missing / sum(sizes)


def mixes_samples(batch: Any) -> bool:
    """A float (B, C) tensor of probability rows, not all one-hot: the soft targets of mixup
    or CutMix, a collate that blends samples on purpose."""
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.dim() == 2 and leaf.shape[1] >= 2:
            rows = leaf.detach().cpu().double()
            on_simplex = bool((rows >= 0).all()) and bool(((rows.sum(1) - 1).abs() <= 1e-3).all())
            if on_simplex and not bool(((rows == 0) | (rows == 1)).all()):
                return True
    return False


class CollateContextCheck(Check):
    """COLLATE_DEPENDS_ON_BATCH: a custom collate that encodes a sample by its batch."""

    name = "data.collate_context"
    stage = Stage.DATA
    codes = ("COLLATE_DEPENDS_ON_BATCH",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        if not custom_collate(loader):
            findings.data["summary"] = NOT_CUSTOM_COLLATE
            return
        guard = DataGuard(ctx, self.name, findings)
        dataset = loader.dataset
        size = guard.call(len, dataset, what="len(dataset)")
        if size < MIN_SAMPLES:
            findings.data["summary"] = "too few samples"
            return
        count = min(SAMPLES, size)
        indices = [int(i * (size - 1) / (count - 1)) for i in range(count)]  # spread: sorted datasets vary too
        half = count // 2
        with preserved_data_state(ctx):
            samples = [guard.call(dataset.__getitem__, i, what=f"dataset[{i}]") for i in indices]

            def collate(part: list[Any], seed: int = 0) -> Any:
                return guard.call(collate_seeded, loader.collate_fn, copy.deepcopy(part), seed, what="collate_fn(samples)")

            try:
                first, first_again = collate(samples[:half]), collate(samples[:half], 1)
                second, whole, reversed_whole = collate(samples[half:]), collate(samples), collate(samples[::-1])
            except Exception as error:  # the loader's own first batch worked: a collate of these samples may not
                findings.data["summary"] = f"collate_fn raised on {count} samples: {type(error).__name__}"
                return
        if disagreeing(whole, reversed_whole, count) is not None:
            findings.data["summary"] = "tensors in different orders (data.collate_order)"
            return
        found = batch_dependent(first, first_again, second, whole, (half, count - half))
        if found and mixes_samples(whole):
            findings.data["summary"] = "samples blended with each other, with soft targets (mixup, CutMix)"
            return
        findings.data["summary"] = "each sample collated alike in any batch" if not found else "batch-dependent tensors"
        if not found:
            return
        blamed, share = found
        names = leaf_names(whole)
        where = " and ".join(names[i] if i < len(names) else f"tensor {i}" for i in blamed)
        findings.warning(
            "COLLATE_DEPENDS_ON_BATCH",
            f"the collate_fn gives the same sample different values depending on the other samples in its batch: "
            f"{count} samples collated as two batches of {half} and as one batch of {count} disagree in {where} "
            f"for {share:.0%} of the samples, beyond padding and order. Typical causes: categories or class ids "
            "re-indexed from the values present in each batch (torch.unique(..., return_inverse=True), "
            "pd.factorize, a vocab built in the collate_fn), or features or targets standardised with the "
            "batch's own mean and std; the model then sees an encoding that changes from batch to batch, and "
            "validation is encoded differently again",
            "Make collate_fn a function of each sample alone: build vocabularies, label encoders and normalisation "
            "statistics once, from the training set (in the Dataset or before the DataLoader), and only stack and "
            "pad in collate_fn.",
        )
