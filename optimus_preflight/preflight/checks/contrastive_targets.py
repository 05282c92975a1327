"""Whether an in-batch contrastive loss's positives come from the same sample
(``step.contrastive_targets``).

``IN_BATCH_POSITIVES_MISMATCHED``: NT-Xent / InfoNCE / CLIP losses are a cross-entropy over
``(N, N)`` similarities whose target names, for each row, the column of its positive: the
other view (or the paired caption) of the same sample. The targets are built inside the
loss from a layout (``(arange(2B) + B) % 2B`` for ``torch.cat([z1, z2])``, ``arange(B)`` for
paired rows), and a layout that differs from the one the embeddings are really in
(``torch.stack([z1, z2], 1).reshape(2B, -1)`` interleaves them) makes every "positive" an
unrelated sample. The loss still falls, by pulling random pairs together.

``IN_BATCH_VIEWS_IDENTICAL``: the two views of each sample are one tensor (an augmentation
applied once and used twice, or a deterministic transform), so every positive pair is an
embedding and itself: with normalised embeddings each positive score is the largest score
possible, 1 / temperature, identical in every row, and the loss is solved without learning
anything that transfers. Read from one train-mode forward (dropout and random augmentation
active, as in training: SimCSE's two dropout passes over one input differ there).

``CONTRASTIVE_TEMPERATURE_TOO_HIGH``: the scores are the cosines of unit-norm embeddings times
a factor below 0.5 (a temperature above 2, typically 1 / 0.07 = 14.3 given where 0.07 was
meant). Every logit then stays near 0 and the softmax near uniform: measured on a SimCLR MLP
(600 steps), held-out view retrieval was 0.16 at temperature 0.1, 0.093 at 1, 0.067 at 2 and
0.052 at 14.3. Read from the product feeding the cross-entropy: its operands' rows have norm 1
and the scores are one multiple of it.

Measured, not read from the code: with the model in eval mode and the RNG reseeded before
each call (so random augmentations repeat), the loss is computed on the first batch and
again with one sample's inputs changed. The rows of the similarity matrix that change in
most of their columns are that sample's rows; the columns that change in the other rows
are its columns. Each of its rows' target must be one of its columns.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import seeded_eval_forward
from optimus_preflight.preflight.analyses.pair_mask import PairMask
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_ROWS = 8
MOST = 0.5  # share of a row's (or column's) entries that change for it to be the sample's
MAX_ROWS_PER_SAMPLE = 4  # views of one sample; more means the change spread (no conclusion)
PROBED_SAMPLES = (0, 1, 2, 5, 9)  # past the first few: class-id targets often equal a small row index
NO_POSITIVE_SHARE = 0.5  # of a batch's samples without a positive in it
SEED = 20240611


PRODUCTS = {"matmul", "mm", "__matmul__", "__rmatmul__"}
MIN_CLASSES_SCORED = 10  # class logits from cosines: a catalogue, where the bound on the softmax bites


class SimilarityWatch(TorchFunctionMode):
    """Keeps the first cross-entropy over square ``(N, N)`` scores with an index target, whether
    a square product before it multiplied a tensor with itself (``z1 @ z1.T``), and, when that
    product was of unit-norm rows (cosines), the factor the scores are its multiple of (the
    inverse temperature)."""

    def __init__(self) -> None:
        super().__init__()
        self.scores: torch.Tensor | None = None
        self.target: torch.Tensor | None = None
        self.self_product = False
        self.cosines: torch.Tensor | None = None
        self.cosine_scale: float | None = None
        # Class logits (B, C) that are a multiple of cosines: an item catalogue scored by
        # normalised embeddings. (scale, classes) of the first such cross-entropy.
        self.product_cosines: torch.Tensor | None = None
        self.class_cosines: tuple[float, int] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if getattr(func, "__name__", "") in PRODUCTS and len(args) >= 2 and self.class_cosines is None:
            left, right = args[0], args[1]
            if isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor) and left.dim() == right.dim() == 2 \
                    and left.shape[0] >= MIN_ROWS and right.shape[1] >= MIN_CLASSES_SCORED:
                self.product_cosines = (result.detach().float().clone() if unit_rows(left) and unit_rows(right.T)
                                        else None)
        if getattr(func, "__name__", "") in PRODUCTS and self.scores is None and len(args) >= 2:
            left, right = args[0], args[1]
            if isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor) and left.dim() == right.dim() == 2 \
                    and left.shape[0] == right.shape[1] and left.shape[0] >= MIN_ROWS:
                self.self_product = left.untyped_storage().data_ptr() == right.untyped_storage().data_ptr() \
                    and left.data_ptr() == right.data_ptr()
                self.cosines = result.detach().float().clone() if unit_rows(left) and unit_rows(right.T) else None
        if func is F.cross_entropy and self.class_cosines is None and len(args) >= 2 \
                and isinstance(args[0], torch.Tensor) and args[0].dim() == 2 and args[0].shape[0] != args[0].shape[1] \
                and self.product_cosines is not None and self.product_cosines.shape == args[0].shape:
            scale = multiple_of(args[0].detach().float(), self.product_cosines)
            if scale is not None:
                self.class_cosines = (scale, int(args[0].shape[1]))
        if func is F.cross_entropy and self.scores is None and len(args) >= 2:
            scores, target = args[0], args[1]
            if (isinstance(scores, torch.Tensor) and isinstance(target, torch.Tensor) and scores.dim() == 2
                    and scores.shape[0] == scores.shape[1] >= MIN_ROWS and target.dim() == 1
                    and target.shape[0] == scores.shape[0] and not target.is_floating_point()):
                self.scores, self.target = scores.detach().float().clone(), target.detach().clone()
                self.cosine_scale = multiple_of(self.scores, self.cosines)
        return result


UNIT = 1e-3  # tolerance on a row's norm for it to count as normalised


def unit_rows(matrix: torch.Tensor) -> bool:
    with torch.no_grad():
        norms = matrix.detach().float().norm(dim=1)
    return bool(((norms - 1).abs() < UNIT).all())


def multiple_of(scores: torch.Tensor, cosines: torch.Tensor | None) -> float | None:
    """The one factor that turns the cosines into the scores (1 / temperature), read where the
    scores are finite and unmasked; None when they are not a multiple of the cosines."""
    if cosines is None or cosines.shape != scores.shape:
        return None
    cosines = cosines.to(scores.device)
    usable = torch.isfinite(scores) & (scores.abs() < 1e8) & (cosines.abs() > 0.05)
    if int(usable.sum()) < scores.shape[0]:
        return None
    ratio = scores[usable] / cosines[usable]
    factor = float(ratio.median())
    if factor <= 0 or float((ratio - factor).abs().max()) > 1e-3 * factor:
        return None
    return factor


def seeded_watch(ctx: PreflightContext, batch: Any) -> SimilarityWatch:
    watch = SimilarityWatch()
    with watch:
        seeded_eval_forward(ctx, batch, SEED)
    return watch


def seeded_scores(ctx: PreflightContext, batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    watch = seeded_watch(ctx, batch)
    if watch.scores is None or watch.target is None:
        return None
    return watch.scores, watch.target


def train_mode_scores(ctx: PreflightContext, batch: Any) -> tuple[torch.Tensor, torch.Tensor, bool] | None:
    """The (N, N) scores and targets of one train-mode forward without gradients (dropout and
    random augmentation as the training step has them), and whether the scores are a product
    of one tensor with itself."""
    watch = SimilarityWatch()
    with preserved_training_state(ctx), torch.no_grad():
        ctx.model.train()
        with ctx.training.plan.autocast(), watch:
            ctx.compute_loss(ctx.model, batch)
    if watch.scores is None or watch.target is None:
        return None
    return watch.scores, watch.target, watch.self_product


WEAK_SCALE = 0.5  # cosines multiplied by less than this: a temperature above 2
IDENTICAL = 1e-4  # relative spread of the positive scores (and their gap to the largest) of identical views


def identical_positives(scores: torch.Tensor, target: torch.Tensor) -> float | None:
    """The common positive score when every row's positive equals the largest finite score
    of the matrix (identical, normalised views); None otherwise."""
    finite = torch.isfinite(scores) & (scores.abs() < 1e8)
    if not bool(finite.any()) or int(target.min()) < 0 or int(target.max()) >= scores.shape[1]:
        return None
    positives = scores.gather(1, target.long().unsqueeze(1)).squeeze(1)
    largest = float(scores[finite].max())
    scale = max(abs(largest), 1e-6)
    if float(positives.max() - positives.min()) > IDENTICAL * scale or largest - float(positives.min()) > IDENTICAL * scale:
        return None
    return float(positives.mean())


PARTNER_RANK = 0.75  # the partner's mean standing among a row's other scores (0.5: no partner)


def stacked_partner(scores: torch.Tensor) -> str | None:
    """Whether the rows are two views of each sample stacked: the score at the partner
    position of one layout, ``i + N/2`` (torch.cat([z1, z2])) or ``i ^ 1`` (interleaved), stands
    above most of its row's other scores (two views of one sample are alike even at
    initialisation). Paired rows of one view each have no partner."""
    rows = scores.shape[0]
    if rows % 2 or rows < MIN_ROWS:
        return None
    others = scores.float().cpu().clone()
    others.fill_diagonal_(float("nan"))
    index = torch.arange(rows)
    for layout, partner in (("concatenated", (index + rows // 2) % rows), ("interleaved", index ^ 1)):
        standing = (others < others[index, partner][:, None]).float().sum(1) / (rows - 2)
        if float(standing.mean()) >= PARTNER_RANK:
            return layout
    return None


def with_sample_changed(batch: Any, index: int, rows: int) -> Any | None:
    """The batch with sample ``index`` of every floating (rows, ...) tensor moved (a sign flip
    and a shift) and of every (rows, length) integer tensor given the next sample's ids; None
    when the batch has no such tensor."""
    changed = False

    def move(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 1 and value.shape[0] == rows:
            copy = value.clone()
            copy[index] = -copy[index] + value.float().std().to(value.dtype)
            changed = True
            return copy
        # Token ids of one modality (a caption): sample index reads another sample's tokens.
        # 1-D integer tensors are labels and ids of the sample as a whole: left alone.
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.dtype != torch.bool \
                and value.dim() >= 2 and value.shape[0] == rows and rows >= 2:
            other = (index + 1) % rows
            if torch.equal(value[index], value[other]):
                return value
            copy = value.clone()
            copy[index] = value[other]
            changed = True
            return copy
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(move(item) for item in value)
        if isinstance(value, dict):
            return {key: move(item) for key, item in value.items()}
        return value

    moved = move(batch)
    return moved if changed else None


def sample_rows_and_columns(before: torch.Tensor, after: torch.Tensor) -> tuple[list[int], list[int]]:
    finite = torch.isfinite(before) & torch.isfinite(after) & (before.abs() < 1e8)
    scale = before[finite].abs().max().clamp_min(1e-6) if bool(finite.any()) else torch.tensor(1.0)
    changed = ((after - before).abs() > 1e-5 * scale) & finite
    rows = [r for r in range(changed.shape[0]) if float(changed[r].float().mean()) > MOST]
    others = [r for r in range(changed.shape[0]) if r not in rows]
    if not others:
        return rows, []
    columns = [c for c in range(changed.shape[1]) if float(changed[others, c].float().mean()) > MOST]
    return rows, columns


class ContrastiveTargetsCheck(Check):
    """IN_BATCH_POSITIVES_MISMATCHED: the (N, N) cross-entropy's targets name other samples."""

    name = "step.contrastive_targets"
    stage = Stage.STEP
    codes = ("IN_BATCH_POSITIVES_MISMATCHED", "IN_BATCH_VIEWS_IDENTICAL", "IN_BATCH_POSITIVE_IS_SELF",
             "IN_BATCH_NO_POSITIVES", "CONTRASTIVE_TEMPERATURE_TOO_HIGH")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)  # computed here when the first step's check is not in the run
        mask = probe.pair_mask if probe.completed else None
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        rows = batch_size_of(batch)
        try:
            watch = seeded_watch(ctx, batch)
        except Exception:
            self._positives(mask, findings)
            findings.data["summary"] = "the loss could not be observed"
            return
        base = (watch.scores, watch.target) if watch.scores is not None and watch.target is not None else None
        # A cross-entropy whose rows each target a column of their own (arange(B) over u @ v.T)
        # takes its positives from the pairing; an equality of labels beside it only masks
        # duplicates out of the negatives, and a sample alone in its class still has a positive.
        if base is None or base[1].unique().numel() < base[1].numel():
            self._positives(mask, findings)
        if watch.class_cosines is not None and self._class_cosines_unscaled(*watch.class_cosines, findings):
            return
        if base is None:
            findings.data["summary"] = "no cross-entropy over (N, N) scores"
            return
        if self._temperature_inverted(watch.cosine_scale, base[0], findings):
            return
        try:
            again = seeded_scores(ctx, batch)
        except Exception:
            findings.data["summary"] = "the loss could not be observed"
            return
        if again is None or not torch.equal(base[0], again[0]):
            findings.data["summary"] = "the (N, N) scores do not repeat under a fixed seed"
            return
        scores, target = base
        if target.unique().numel() == 1:  # one column for every row: TARGET_ONE_CLASS names that
            findings.data["summary"] = "one target for every row"
            return
        if self._identical_views(ctx, batch, findings):
            return
        mismatched: list[tuple[int, list[int], list[int], int]] = []
        one_sided: list[tuple[int, list[int], str]] = []  # (sample, where its views landed, "rows" or "columns")
        judged = 0
        for index in PROBED_SAMPLES:
            moved = with_sample_changed(batch, index, rows) if rows and index < rows else None
            if moved is None:
                break
            try:
                found = seeded_scores(ctx, moved)
            except Exception:
                break
            if found is None:
                break
            own_rows, own_columns = sample_rows_and_columns(scores, found[0])
            side = own_rows or own_columns
            if bool(own_rows) != bool(own_columns) and 2 <= len(side) <= MAX_ROWS_PER_SAMPLE:
                one_sided.append((index, side, "rows" if own_rows else "columns"))
                continue
            if not own_rows or not own_columns or len(own_rows) > MAX_ROWS_PER_SAMPLE:
                continue
            judged += 1
            wrong = [row for row in own_rows if int(target[row]) not in own_columns]
            if wrong:
                mismatched.append((index, own_rows, own_columns, int(target[wrong[0]])))
        findings.data["summary"] = f"{judged} sample(s) traced through the ({scores.shape[0]}, {scores.shape[1]}) scores"
        if not judged and len(one_sided) >= 2:
            index, where, side = one_sided[0]
            rows = scores.shape[0]
            findings.warning(
                "IN_BATCH_POSITIVES_MISMATCHED",
                f"the two views of a sample are never compared with each other: sample {index} of the batch lands in "
                f"{side} {where} of the ({rows}, {scores.shape[1]}) in-batch similarities and in none of the "
                f"{'columns' if side == 'rows' else 'rows'} (and so for {len(one_sided)} traced samples), so its "
                "positive pairs are two different samples. The stacked embeddings z = model(torch.cat([v1, v2])) "
                f"(rows 0..B-1 the first views, B..2B-1 the second) were split with z.view(B, 2, -1).unbind(1), which "
                "pairs rows 2i and 2i+1 (both from one view, of different samples), where z.chunk(2) was meant",
                "Split the stacked embeddings the way they were stacked: z1, z2 = z.chunk(2) (or z[:B], z[B:]) for "
                "torch.cat([v1, v2]); z.view(B, 2, -1).unbind(1) is right only for torch.stack([v1, v2], 1).",
            )
            return
        # One traced sample may match by chance (a class id equal to its row number); two must not.
        if judged >= 2 and len(mismatched) >= max(2, judged - 1):
            index, own_rows, own_columns, named = mismatched[0]
            if target.unique().numel() < target.numel():  # many rows name one column: labels, not a layout
                findings.warning(
                    "IN_BATCH_POSITIVES_MISMATCHED",
                    f"the loss's cross-entropy over ({scores.shape[0]}, {scores.shape[1]}) in-batch similarities "
                    f"takes as targets values that repeat across rows ({target.unique().numel()} distinct among "
                    f"{target.numel()}: class labels or ids of the batch, not positions in it): sample {index} lands in "
                    f"row {own_rows[0]} and column {own_columns[0]}, yet its target is column {named}, another "
                    "sample's pair. The positive of row i of a (B, B) similarity matrix is the column of its own pair, "
                    "torch.arange(B); with class labels as targets every row is pulled towards whichever sample "
                    "happens to sit at the position of its class number",
                    "Use the positions of the pairs as targets: labels = torch.arange(B, device=logits.device) for "
                    "cross_entropy(image @ text.T / t, labels) (and its transpose); to treat same-class samples as "
                    "positives, use a supervised contrastive loss with a mask built from the labels.",
                )
                return
            findings.warning(
                "IN_BATCH_POSITIVES_MISMATCHED",
                f"the loss's cross-entropy over ({scores.shape[0]}, {scores.shape[1]}) in-batch similarities names "
                f"positives from other samples: sample {index} of the batch lands in rows {own_rows} and columns "
                f"{own_columns}, yet the target of row {own_rows[0]} is column {named}. The targets assume one layout "
                "of the views (torch.cat([z1, z2]) for (arange(2B) + B) % 2B) while the embeddings are in another "
                "(torch.stack([z1, z2], dim=1).reshape(2B, -1) interleaves them), so every 'positive' pair is two "
                "unrelated samples",
                "Build the embeddings and the targets from one layout: z = torch.cat([z1, z2]) with targets "
                "(torch.arange(2 * B) + B) % (2 * B), or for interleaved rows targets torch.arange(2 * B) ^ 1.",
            )

    @staticmethod
    def _class_cosines_unscaled(scale: float, classes: int, findings: Findings) -> bool:
        """Class logits that are cosines times ``scale``: even a perfect model (cosine 1 with its
        class, -1 with every other) gives its class less than half the softmax."""
        best = math.exp(scale) / (math.exp(scale) + (classes - 1) * math.exp(-scale))
        if best >= 0.5:
            return False
        floor = -math.log(best)
        findings.data["summary"] = f"class logits are {scale:.3g} x cosines over {classes} classes"
        findings.warning(
            "CONTRASTIVE_TEMPERATURE_TOO_HIGH",
            f"cross_entropy scores {classes} classes with logits that are cosines of normalised embeddings times "
            f"{scale:.3g} (no temperature, or one near 1): logits stay within [-{scale:.3g}, {scale:.3g}], so even a "
            f"perfect model, cosine 1 with its class and -1 with all others, gives the true class only {best:.1%} of "
            f"the softmax; the loss cannot fall below {floor:.2f} and its gradients stay small",
            "Divide the cosines by a temperature (logits = F.normalize(u) @ F.normalize(items).T / 0.05, or a learned "
            "logit scale initialised near 1 / 0.07), so the true class can take most of the softmax.",
        )
        return True

    @staticmethod
    def _temperature_inverted(scale: float | None, scores: torch.Tensor, findings: Findings) -> bool:
        """The cosines are multiplied by less than ``WEAK_SCALE``: a temperature above 1 / WEAK_SCALE
        (1 / 0.07 = 14.3 typed where 0.07 was meant, or ``cos * tau`` for ``cos / tau``)."""
        if scale is None or scale >= WEAK_SCALE:
            return False
        columns = int((torch.isfinite(scores[0]) & (scores[0].abs() < 1e8)).sum())
        floor = math.log(1 + (columns - 1) * math.exp(-2 * scale))
        findings.data["summary"] = f"the cosines are scaled by {scale:.3g} (temperature {1 / scale:.3g})"
        findings.warning(
            "CONTRASTIVE_TEMPERATURE_TOO_HIGH",
            f"the in-batch contrastive loss divides its cosine similarities by a temperature of {1 / scale:.3g} "
            f"(they are multiplied by {scale:.3g}), so every logit lies within \u00b1{scale:.3g}: the softmax over the "
            f"{columns} columns stays near uniform, the loss cannot fall below {floor:.3f} even with every positive "
            f"at cosine 1 and every negative at -1 (it starts near log({columns}) = {math.log(columns):.3f}), and "
            "the gradient is scaled down as much. InfoNCE / NT-Xent temperatures are 0.05-0.5 (SimCLR 0.1-0.5, "
            "CLIP and MoCo 0.07); 1 / 0.07 = 14.3 is the inverse temperature, CLIP's initial logit scale",
            "Divide the cosines by a small temperature: logits = F.normalize(z1, dim=1) @ F.normalize(z2, dim=1).T "
            "/ 0.1 (or multiply by the logit scale 1 / 0.07 = 14.3, as CLIP's logit_scale.exp() does).",
        )
        return True

    @staticmethod
    def _positives(mask: PairMask | None, findings: Findings) -> None:
        if mask is None or mask.without_positive < NO_POSITIVE_SHARE * mask.rows:
            return
        findings.warning(
            "IN_BATCH_NO_POSITIVES",
            f"the loss pairs samples within the batch (labels[:, None] == labels[None, :]), but {mask.without_positive} "
            f"of the first batch's {mask.rows} samples share their label with no other sample ({mask.labels} labels in "
            "the batch): those anchors have no positive, so a batch-hard triplet or contrastive term has nothing to "
            "pull them towards and most of the batch trains on negatives alone or not at all. Batches drawn at "
            "random from many classes look like this",
            "Sample P classes x K samples per batch (a PK / MPerClassSampler as batch_sampler, e.g. P=8 classes with "
            "K=4 samples each), so every anchor has K-1 positives in its batch.",
        )

    @staticmethod
    def _identical_views(ctx: PreflightContext, batch: Any, findings: Findings) -> bool:
        try:
            trained = train_mode_scores(ctx, batch)
        except Exception:
            return False
        if trained is None:
            return False
        scores, target, self_product = trained
        positive = identical_positives(scores, target)
        if positive is None:
            return False
        findings.data["summary"] = f"every positive score is {positive:.4g}, the largest in the matrix"
        rows = scores.shape[0]
        partner = stacked_partner(scores) if torch.equal(target.long().cpu(), torch.arange(rows)) else None
        if partner is not None:
            # Each row's target is its own column: the diagonal of a self-similarity matrix.
            findings.warning(
                "IN_BATCH_POSITIVE_IS_SELF",
                f"each row's positive in the in-batch contrastive loss is the row itself: the targets are "
                f"torch.arange({rows}), the diagonal of the ({rows}, {rows}) similarities, and every diagonal score is "
                f"{positive:.4g}, the largest in the matrix (an embedding's cosine with itself / temperature). The "
                "similarities are z @ z.T over both views stacked, with the self-similarity diagonal left in, so "
                "the loss is solved at once by every embedding matching itself and the two views of a sample are "
                "never pulled together",
                f"Mask the diagonal (sim.fill_diagonal_(float('-inf')) or sim.masked_fill(torch.eye({rows}, "
                "dtype=torch.bool), float('-inf'))) and target the other view of each sample: "
                + (f"for z = torch.cat([z1, z2]) the targets are (torch.arange({rows}) + {rows // 2}) % {rows}."
                   if partner == "concatenated" else
                   f"for interleaved rows (torch.stack([z1, z2], 1).reshape({rows}, -1)) the targets are "
                   f"torch.arange({rows}) ^ 1."),
            )
            return True
        if self_product and torch.equal(target.long().cpu(), torch.arange(rows)):
            # Each row's target is its own column of one embedding set times itself; stacked views
            # (z = cat([z1, z2]), z @ z.T) with partner targets are the usual NT-Xent and go on below.
            findings.warning(
                "IN_BATCH_POSITIVE_IS_SELF",
                f"each row's positive in the in-batch contrastive loss is the row itself: the ({rows}, {rows}) "
                "similarities are one view's embeddings multiplied by themselves (z1 @ z1.T where z1 @ z2.T was "
                f"meant), so every diagonal score is {positive:.4g}, the largest in the matrix (an embedding's cosine "
                "with itself / temperature), the second view is never compared, and the loss is solved without "
                "learning any invariance to the augmentation",
                "Score one view against the other: logits = z1 @ z2.T / temperature with targets torch.arange(B) "
                "(and symmetrically z2 @ z1.T), so each sample's positive is its other view.",
            )
            return True
        findings.warning(
            "IN_BATCH_VIEWS_IDENTICAL",
            f"the in-batch contrastive loss's positive pairs are identical: in a train-mode forward every row's "
            f"positive score in the ({scores.shape[0]}, {scores.shape[1]}) similarities is {positive:.4g}, the "
            "largest score in the matrix (cosine 1 / temperature), so each sample is paired with its own embedding. "
            "The two views are identical (an augmentation drawn once and used twice, view2 = view1, a random "
            "generator re-seeded with the same seed before each view, or a transform with nothing random in it): the loss is solved by any embedding that tells the samples apart, and "
            "nothing invariant to augmentation is learned",
            "Draw two independent random views per sample: view1, view2 = augment(x), augment(x), with an augment "
            "that is random on each call (crops, noise, masking, dropout) and a generator seeded once, not per view; SimCSE-style training feeds one input "
            "twice and relies on dropout being active in train mode.",
        )
        return True
