"""Category ids that stand for other categories in validation (``data.split_codes``).

``VAL_IDS_RECODED``: a categorical column encoded to integer ids once per split (a second
``LabelEncoder`` fitted on the validation frame, codes in order of first appearance, a
vocabulary rebuilt per split). Every id is valid in both splits, so nothing fails; but id 3
is one city in training and another in validation, and the embedding learned for it is
applied to the wrong category.

Read from the batches (up to 2048 training and 1024 validation samples): for each integer
id input beside the target (a ``(B,)`` column, or a column of ``(B, k)`` ids), the mean target
of each id. Where the ids matter (two halves of the training set agree on the per-id means,
correlation 0.6 or more), validation's per-id means should agree too; ids whose validation
means are unrelated to training's (correlation at least 0.5 lower, and under 0.3) mean other
categories there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRAIN_SAMPLES, VAL_SAMPLES, BUDGET_S = 2048, 1024, 2.0
MAX_ID_COLUMNS = 8
MAX_FLOAT_COLUMNS = 64  # a feature table, not an image or a signal
MIN_PER_ID_TRAIN, MIN_PER_ID_VAL, MIN_IDS = 6, 3, 5
MATTERS = 0.6  # per-id means of two training halves correlate at least this much
DROP, UNRELATED = 0.5, 0.3
DECISIVE = 0.9  # halves agreeing this well: a drop of DROP is enough, whatever is left
MAX_CLASSES = 20


def ids_and_target(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(integer id columns (B, k), target (B, c) float) of a tuple batch whose last element is the
    target (float (B,) / (B, 1), or class ids) and whose other elements include integer ids."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return None
    *inputs, target = batch
    if not isinstance(target, torch.Tensor) or target.dim() not in (1, 2) or target.dtype == torch.bool:
        return None
    rows = len(target)
    if target.is_floating_point():
        if target.dim() == 2 and target.shape[1] != 1:
            return None
        y = target.detach().reshape(rows, 1).float()
    else:
        if target.dim() != 1 or int(target.min()) < 0 or int(target.max()) >= MAX_CLASSES:
            return None
        y = torch.nn.functional.one_hot(target.detach().long(), MAX_CLASSES).float()
    columns = [t.detach().reshape(rows, -1) for t in inputs if isinstance(t, torch.Tensor) and len(t) == rows
               and not t.is_floating_point() and t.dtype != torch.bool and t.dim() in (1, 2)
               and (t.dim() == 1 or t.shape[1] <= MAX_ID_COLUMNS)]
    # Codes kept in a float feature table and cast with .long() for an embedding in forward:
    # its whole-number, non-negative columns.
    columns += [t.detach()[:, whole] for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.dim() == 2 and len(t) == rows and t.shape[1] <= MAX_FLOAT_COLUMNS
                and bool((whole := ((t == t.round()) & (t >= 0)).all(0)).any())]
    if not columns or not torch.isfinite(y).all():
        return None
    return torch.cat(columns, 1).long().cpu(), y.cpu()


def _per_id_means(ids: torch.Tensor, y: torch.Tensor, least: int) -> dict[int, torch.Tensor]:
    values, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(values), y.shape[1]).index_add_(0, inverse, y)
    return {int(v): sums[i] / counts[i] for i, v in enumerate(values) if counts[i] >= least}


def _agreement(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> float | None:
    shared = sorted(set(a) & set(b))
    if len(shared) < MIN_IDS:
        return None
    x = torch.stack([a[i] for i in shared]).reshape(-1)
    z = torch.stack([b[i] for i in shared]).reshape(-1)
    if float(x.std()) == 0 or float(z.std()) == 0:
        return None
    return float(torch.corrcoef(torch.stack([x, z]))[0, 1])


def recoded_columns(train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor]
                    ) -> list[tuple[int, float, float]]:
    """(column, agreement of two training halves, agreement of training with validation) for the
    id columns whose validation ids relate to the target unlike training's (pure)."""
    (train_ids, train_y), (val_ids, val_y) = train, val
    order = torch.randperm(len(train_ids), generator=torch.Generator().manual_seed(0))
    half = len(order) // 2
    found = []
    for column in range(train_ids.shape[1]):
        ids = train_ids[:, column]
        if int(torch.unique(ids).numel()) < MIN_IDS:
            continue
        first = _per_id_means(ids[order[:half]], train_y[order[:half]], MIN_PER_ID_VAL)
        second = _per_id_means(ids[order[half:]], train_y[order[half:]], MIN_PER_ID_VAL)
        halves = _agreement(first, second)
        split = _agreement(_per_id_means(ids, train_y, MIN_PER_ID_TRAIN),
                           _per_id_means(val_ids[:, column], val_y, MIN_PER_ID_VAL))
        # Ids that nearly decide the target (halves agreeing at 0.9) lose more than half of that in
        # validation only when many of them changed meaning: the few kept by chance hold some agreement.
        if halves is not None and split is not None and halves >= MATTERS and split <= halves - DROP \
                and (split < UNRELATED or halves >= DECISIVE):
            found.append((column, halves, split))
    return found


class SplitCodesCheck(Check):
    """VAL_IDS_RECODED: integer category ids that mean other categories in validation."""

    name = "data.split_codes"
    stage = Stage.DATA
    codes = ("VAL_IDS_RECODED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if ctx.val_loader is None or ids_and_target(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "no validation loader, or no integer ids beside a target"
            return
        parts = {}
        for split, loader, limit in (("training", ctx.train_loader, TRAIN_SAMPLES),
                                     ("validation", ctx.val_loader, VAL_SAMPLES)):
            read = read_samples(ctx, self.name, findings, loader, f"{split} ids for {self.name}", ids_and_target,
                                limit, BUDGET_S)
            if not read or len({ids.shape[1] for ids, _ in read}) != 1 or len({y.shape[1] for _, y in read}) != 1:
                return
            parts[split] = (torch.cat([ids for ids, _ in read]), torch.cat([y for _, y in read]))
        if parts["training"][0].shape[1] != parts["validation"][0].shape[1]:
            return
        found = recoded_columns(parts["training"], parts["validation"])
        findings.data["summary"] = f"{len(found)} id column(s) recoded in validation"
        if not found:
            return
        column, halves, split = found[0]
        findings.warning(
            "VAL_IDS_RECODED",
            f"the integer ids of input column {column} mean other categories in validation than in training: the "
            f"mean target of each id agrees between two halves of the training set (correlation {halves:.2f}) but "
            f"not between training and validation ({split:.2f}). The category -> id mapping was built separately "
            "for each split (a LabelEncoder or pd.factorize fitted on the validation frame again, codes in order "
            "of first appearance, a vocabulary rebuilt per split), so id 3 is one category in training and another "
            "in validation, and the embedding learned for each id is applied to the wrong category",
            "Fit the encoding once, on the training split (mapping = {c: i for i, c in enumerate(sorted(set("
            "train_values)))}), and encode every split with that same mapping (unknown categories -> a reserved id); "
            "save it with the model.",
            "data.val",
        )
