"""Multi-label tag columns that mean other tags in validation (``data.split_tags``).

``VAL_TAG_COLUMNS_RECODED``: multi-hot targets binarised with a tag vocabulary fitted per split
(a ``MultiLabelBinarizer`` or ``sorted(set(tags))`` built on the validation frame again). When
validation lacks a tag, every column after it moves by one: column 5 is "dog" in training and
"rain" in validation. Shapes and values stay valid; the validation score is wrong and so is any
threshold tuned on it.

Read from the samples' content: each tag column's profile, the mean standardised input of the
rows that carry it minus the mean of all rows. A tag's profile in validation should resemble its
own profile in training (two halves of the training set show how much it does). Columns whose
validation profile resembles another training column's far better than its own mean other tags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRAIN_SAMPLES, VAL_SAMPLES, BUDGET_S = 2048, 1024, 2.0
MAX_FEATURES = 4096  # flattened input values read per sample
MIN_POSITIVES = 5  # rows carrying a tag before its profile says anything
OWN = 0.5  # cosine of a tag's profile between two training halves: the profiles mean something
OTHER = 0.3  # a validation column whose own training profile is under this ...
BETTER = 0.5  # ... while another training column's is over this
RECODED_SHARE = 0.5  # of the judged columns


def tags_beside_inputs(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs (B, D) float, multi-hot targets (B, C) 0/1) of an (x, y) batch."""
    pair = inputs_beside_labels(batch)
    if pair is None:
        return None
    x, y = pair
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or not x.is_floating_point() \
            or y.dim() != 2 or y.shape[1] < 3 or len(y) != len(x) or not y.is_floating_point():
        return None
    if not bool(((y == 0) | (y == 1)).all()) or not bool((y.sum(1) >= 1).any()):
        return None
    flat = x.detach().reshape(len(x), -1)
    stride = max(1, flat.shape[1] // MAX_FEATURES)
    return flat[:, ::stride].float().cpu(), y.detach().float().cpu()


def _profiles(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(profiles (C, D), which columns have enough positives)."""
    counts = y.sum(0)
    means = (y.T @ x) / counts.clamp_min(1)[:, None]
    return torch.nn.functional.normalize(means - x.mean(0), dim=1), counts >= MIN_POSITIVES


def recoded_tags(train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor]
                 ) -> list[tuple[int, int, float, float]] | None:
    """(validation column, the training column it resembles, own cosine, that cosine) per recoded
    column, when enough are; None when the columns keep their meaning or cannot be judged (pure)."""
    (tx, ty), (vx, vy) = train, val
    mean, std = tx.mean(0), tx.std(0).clamp_min(1e-6)
    tx, vx = (tx - mean) / std, (vx - mean) / std
    half = len(tx) // 2
    first, enough_first = _profiles(tx[:half], ty[:half])
    second, enough_second = _profiles(tx[half:], ty[half:])
    whole, enough_train = _profiles(tx, ty)
    valp, enough_val = _profiles(vx, vy)
    judged = [c for c in range(ty.shape[1]) if enough_first[c] and enough_second[c] and enough_val[c]
              and float(first[c] @ second[c]) >= OWN]
    if len(judged) < 3:
        return None
    similarity = valp @ whole.T  # (validation column, training column)
    found = []
    for c in judged:
        row = similarity[c].masked_fill(~enough_train, -1.0)
        best = int(row.argmax())
        if best != c and float(similarity[c, c]) < OTHER and float(row[best]) > BETTER:
            found.append((c, best, float(similarity[c, c]), float(row[best])))
    return found if len(found) >= RECODED_SHARE * len(judged) else None


class SplitTagsCheck(Check):
    """VAL_TAG_COLUMNS_RECODED: multi-hot validation columns that carry other tags."""

    name = "data.split_tags"
    stage = Stage.DATA
    codes = ("VAL_TAG_COLUMNS_RECODED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if ctx.val_loader is None or tags_beside_inputs(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "no validation loader, or no multi-hot targets beside float inputs"
            return
        parts = {}
        for split, loader, limit in (("training", ctx.train_loader, TRAIN_SAMPLES),
                                     ("validation", ctx.val_loader, VAL_SAMPLES)):
            read = read_samples(ctx, self.name, findings, loader, f"{split} tags for {self.name}", tags_beside_inputs,
                                limit, BUDGET_S)
            if not read or len({(x.shape[1], y.shape[1]) for x, y in read}) != 1:
                return
            parts[split] = (torch.cat([x for x, _ in read]), torch.cat([y for _, y in read]))
        (tx, ty), (vx, vy) = parts["training"], parts["validation"]
        if tx.shape[1] != vx.shape[1] or ty.shape[1] != vy.shape[1]:
            return
        found = recoded_tags(parts["training"], parts["validation"])
        findings.data["summary"] = f"{len(found or [])} multi-hot column(s) recoded in validation"
        if not found:
            return
        shifts = {best - column for column, best, _, _ in found}
        column, best, own, other = found[0]
        empty = [c for c in range(vy.shape[1]) if float(vy[:, c].sum()) == 0 and float(ty[:, c].sum()) > 0]
        findings.warning(
            "VAL_TAG_COLUMNS_RECODED",
            f"{len(found)} multi-hot tag columns mean other tags in validation than in training: validation column "
            f"{column}'s rows look like training column {best}'s (profile cosine {other:.2f}), not its own "
            f"({own:.2f})" + (f", every one shifted by {shifts.pop():+d}" if len(shifts) == 1 else "")
            + (f"; column(s) {empty[:3]} never occur in validation" if empty else "")
            + ". The tag vocabulary was built per split (a MultiLabelBinarizer or sorted(set(tags)) fitted on the "
            "validation frame again): a tag missing from one split shifts every column after it, so the validation "
            "score compares each prediction with another tag",
            "Fit the tag vocabulary once, on the training split, and binarise every split with it "
            "(MultiLabelBinarizer(classes=train_tags).fit(...) then .transform on each split; unknown tags dropped).",
            "data.val",
        )
