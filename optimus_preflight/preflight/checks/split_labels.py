"""Validation labels that name other classes than the training labels (``data.split_labels``).

Label ids built separately per split (``sorted(set(names)).index`` or a ``LabelEncoder``
fitted on each split, ``ImageFolder`` roots with different class folders) give one class
different ids in training and validation as soon as a split lacks a class. Every shape,
range and dtype stays right; the validation score is simply wrong.

The mechanism is read from the samples' content, not from the code: the nearest training
sample of a sample usually carries its class (measured within the training set, leaving
the sample out). When validation samples agree with their nearest training sample far
less often than training samples do, and a relabelling of the validation ids restores the
agreement, the validation ids mean other classes. A distribution shift lowers the
agreement too, but no relabelling brings it back.

Features are the batch's floating tensor (flattened, strided to ``MAX_READ_DIM`` values,
standardised on the training rows, projected to ``PROJECTED_DIM`` when wider); labels its
integer ``(B,)`` tensor.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler, TensorDataset

from optimus_preflight.preflight.analyses.column_relations import RelationChange, relation_change
from optimus_preflight.preflight.analyses.label_signal import label_signal
from optimus_preflight.preflight.analyses.sample_scaling import sample_normalisation
from optimus_preflight.preflight.analyses.token_tags import ids_and_tags, tag_renumbering
from optimus_preflight.preflight.analyses.train_shortcut import Shortcut, train_only_shortcut
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.feature_leak import LABEL_KEYS
from optimus_preflight.preflight.checks.split_overlap import few_integers
from optimus_preflight.preflight.checks.split_scale import inputs_beside_labels, scale_mismatch
from optimus_preflight.preflight.data_access.guard import DataGuard, read_samples
from optimus_preflight.preflight.data_access.samples import ordered_loader, sample_hashes
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state, preserved_training_state
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRAIN_SAMPLES = 2048
VAL_SAMPLES = 512
MIN_TRAIN, MIN_VAL = 256, 64
MAX_CLASSES = 100
SCAN_BUDGET_S = 2.0  # per loader
PROJECTED_DIM = 256
MAX_READ_DIM = 2048  # values kept per sample while reading (strided), so 2048 images stay small
MIN_CLASS_SAMPLES = 5  # validation samples of a class before its relabelling counts
# The training set's own neighbour agreement must be well above the majority share, or
# the features say too little about the labels to compare anything.
ABOVE_MAJORITY = 0.2
SCRAMBLED_MARGIN = 0.05  # training agreement at most this above the largest class's share: chance
DROP = 0.25  # validation agreement at least this much below the training agreement ...
RESTORED = 0.1  # ... and within this of it once the validation ids are relabelled
MIN_SEQUENCE = 8  # token positions before an integer input is text, not a few ids
BAG_BUCKETS = 256  # hashed token counts the label-signal probe reads from text (label_signal's limit)
FEW_IDS = 2  # integer values per sample's inputs: ids (a user, a user and an item), not features
CONFLICT_SHARE = 0.1  # of the training samples read: identical inputs with another label
MIN_CONFLICTS = 8
SHIFT_DISTANCE = 0.5  # total variation between the training and validation label histograms
KNOWN_MARGIN = 0.3  # above the largest class: the model as given already answers validation
UNLIKE_DROP = 0.5  # neighbour label agreement lost from training to validation with no relabelling restoring it
UNTRAINED_EXPECTED = 20  # training labels a validation class's share predicts before its absence is news
UNTRAINED_SHARED = 0.5  # of the validation labels in classes training names too
ONE_CLASS_TRAIN_MAX = 0.9  # a one-class validation set is news when training's largest class is below this


CODE_SLOTS = 64  # integer values below this in a short integer input: category codes, one-hot encoded


def read_width(flat: torch.Tensor) -> torch.Tensor:
    """(B, D) rows cut to at most MAX_READ_DIM values each: an image keeps a fixed stride of its
    values, so what is read stays small and every split reads the same positions."""
    return flat[:, ::-(-flat.shape[1] // MAX_READ_DIM)] if flat.shape[1] > MAX_READ_DIM else flat


def _input_columns(tensor: Any, rows: int) -> torch.Tensor | None:
    """One input of a multi-input batch as (B, D) float columns: floating values flattened,
    a few integer category codes per sample one-hot encoded (code 5 of a column is its own
    column, so a code that names another category per split relates to the labels otherwise);
    None for anything else (token sequences, ids beyond CODE_SLOTS)."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.shape[0] != rows \
            or tensor.layout != torch.strided:
        return None
    if tensor.is_floating_point():
        return tensor.detach().reshape(rows, -1).float().cpu()
    codes = tensor.detach().reshape(rows, -1).cpu()
    if tensor.dtype == torch.bool or tensor.dim() > 2 or codes.shape[1] >= MIN_SEQUENCE or not codes.numel() \
            or bool((codes < 0).any()) or int(codes.max()) >= CODE_SLOTS:
        return None
    return torch.nn.functional.one_hot(codes.long(), CODE_SLOTS).reshape(rows, -1).float()


def _multi_input_features(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(features, labels) of an ``(x1, x2, ..., y)`` batch: categorical codes beside numeric
    columns, an image beside its metadata."""
    labels = labels_only(batch)
    if labels is None:
        return None
    columns = [_input_columns(tensor, len(labels)) for tensor in batch[:-1]]
    if any(column is None for column in columns):
        return None
    features = torch.cat(columns, 1)
    features = read_width(features)
    return features, labels


def feature_names(batch: Any) -> list[str] | None:
    """What each feature column of a multi-input batch is ("input 0, column 2 = code 5"),
    where ``_multi_input_features`` laid them out without striding; None otherwise."""
    if not isinstance(batch, (list, tuple)) or len(batch) <= 2:
        return None
    names: list[str] = []
    for index, tensor in enumerate(batch[:-1]):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            return None
        width = tensor[0].numel()
        if tensor.is_floating_point():
            names += [f"input {index}" + (f", column {c}" if width > 1 else "") for c in range(width)]
        else:
            names += [f"input {index}" + (f", column {c}" if width > 1 else "") + f" = code {code}"
                      for c in range(width) for code in range(CODE_SLOTS)]
    return names if len(names) <= MAX_READ_DIM else None


def features_and_labels(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(features (B, D) float, labels (B,) int) of an ``(x, y)`` batch, an ``(x1, x2, ..., y)``
    batch of several inputs, or a mapping with one label key and one floating tensor beside it."""
    if isinstance(batch, (list, tuple)) and len(batch) > 2:
        return _multi_input_features(batch)
    pair = inputs_beside_labels(batch)
    if pair is None:
        return None
    features, labels = pair
    if not (isinstance(features, torch.Tensor) and isinstance(labels, torch.Tensor)):
        return None
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if (not features.is_floating_point() or features.dim() < 2 or labels.dim() != 1 or labels.is_floating_point()
            or labels.dtype == torch.bool or labels.shape[0] != features.shape[0]):
        return None
    flat = features.detach().reshape(features.shape[0], -1)
    flat = read_width(flat)
    return flat.float().cpu(), labels.detach().long().cpu()


def channel_reversed(batch: Any) -> Any:
    """An ``(images, labels)`` batch with the 3 colour channels of its 4-D images in reverse
    order (RGB <-> BGR), channels first or last; None for other batches."""
    def flipped(images: Any) -> torch.Tensor | None:
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or not images.is_floating_point():
            return None
        axis = 1 if images.shape[1] == 3 else 3 if images.shape[3] == 3 else None
        return None if axis is None else images.flip(axis)

    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        images = flipped(batch[0])
        return None if images is None else (images, batch[1])
    if isinstance(batch, Mapping):
        found = {key: flipped(value) for key, value in batch.items() if key not in LABEL_KEYS}
        found = {key: value for key, value in found.items() if value is not None}
        return {**batch, **found} if len(found) == 1 else None
    return None


def token_bags(batch: Any) -> torch.Tensor | None:
    """Hashed bag-of-words counts (B, ``BAG_BUCKETS``), each row summing to 1, of an ``(ids, y)``
    batch of integer token sequences (at least ``MIN_SEQUENCE`` positions); None otherwise.
    What a bag-of-words model can read: enough for the label-signal probe on text."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2 or not isinstance(batch[0], torch.Tensor):
        return None
    ids = batch[0]
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.dim() != 2 or ids.shape[1] < MIN_SEQUENCE \
            or bool((ids < 0).any()):
        return None
    ids = ids.detach().long().cpu()
    bags = torch.zeros(ids.shape[0], BAG_BUCKETS).scatter_add_(1, ids % BAG_BUCKETS, torch.ones(ids.shape, dtype=torch.float))
    return bags / ids.shape[1]


def labels_only(batch: Any) -> torch.Tensor | None:
    """The integer (B,) labels of an ``(x, y)`` or ``(x1, x2, ..., y)`` batch or of a mapping's
    label key."""
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        labels = batch[-1]
    elif isinstance(batch, Mapping):
        keys = [key for key in LABEL_KEYS if key in batch]
        labels = batch[keys[0]] if len(keys) == 1 else None
    else:
        return None
    if not isinstance(labels, torch.Tensor):
        return None
    if labels.dim() == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.dim() != 1 or labels.is_floating_point() or labels.dtype == torch.bool:
        return None
    return labels.detach().long().cpu()


def masked_labels(batch: Any) -> torch.Tensor | None:
    """The labels a node-classification batch trains on: ``(..., y, mask)`` with integer
    ``(N,)`` labels and a boolean ``(N,)`` mask of the rows that count (a split's node mask)."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 3:
        return None
    labels, mask = batch[-2], batch[-1]
    if not (isinstance(labels, torch.Tensor) and isinstance(mask, torch.Tensor)) or mask.dtype != torch.bool \
            or labels.dim() != 1 or labels.shape != mask.shape or labels.is_floating_point() or labels.dtype == torch.bool:
        return None
    return labels.detach()[mask.detach()].long().cpu()


def input_digests(batch: Any) -> list[str]:
    """One digest per sample of everything in the batch but its labels."""
    if isinstance(batch, (list, tuple)):
        return sample_hashes(batch[0] if len(batch) == 2 else tuple(batch[:-1]))
    keys = [key for key in LABEL_KEYS if key in batch]
    return sample_hashes({key: value for key, value in batch.items() if key not in keys})


def ids_only(batch: Any) -> bool:
    """Whether an ``(x, y)`` or ``(x1, x2, ..., y)`` batch's inputs are a few integer ids per
    sample (a user, a user and an item, a (user, clicked item) pair before a sampled negative):
    such an input maps to many labels by nature (the items a user chose), so equal inputs with
    other labels are the task, not a preprocessing that merged samples."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return False
    inputs = batch[:-1]
    if not all(isinstance(part, torch.Tensor) and part.dim() >= 1 and len(part) > 0 for part in inputs):
        return False
    return sum(part[0].numel() for part in inputs) <= FEW_IDS and all(few_integers(part[0], FEW_IDS)
                                                                       for part in inputs)


@dataclass(frozen=True)
class BagReading:
    rows: int
    width: int
    full: bool  # every row fills its positions: no padding value trails any row
    common_id: int | None = None  # a non-padding id far commoner than the others (an <unk> the lookup fell to)
    common_share: float = 0.0
    sorted_by_length: bool = False  # the training tensor's rows are stored in order of length


COMMON_ID_SHARE = 0.05  # of the non-padding tokens ...
COMMON_ID_RATIO = 3.0  # ... and this many times the median id's share


def commonest_id(ids: torch.Tensor, pad: int | None) -> tuple[int, float] | None:
    """(id, share) of a non-padding id that is at least COMMON_ID_SHARE of the tokens and
    COMMON_ID_RATIO times the median id's share (pure)."""
    tokens = ids.reshape(-1).cpu()
    if pad is not None:
        tokens = tokens[tokens != pad]
    if tokens.numel() < 64:
        return None
    values, counts = torch.unique(tokens, return_counts=True)
    if values.numel() < 4:
        return None
    share = counts.float() / tokens.numel()
    top = int(share.argmax())
    if float(share[top]) >= COMMON_ID_SHARE and float(share[top]) >= COMMON_ID_RATIO * float(share.median()):
        return int(values[top]), float(share[top])
    return None


def stored_by_length(dataset: Any, pad: int | None) -> bool:
    """Whether a TensorDataset's token rows are stored in order of their length (a sort for
    bucketing): almost every next row is at least as long, and the lengths vary."""
    tensors = getattr(dataset, "tensors", None)
    if not isinstance(dataset, TensorDataset) or not tensors or pad is None:
        return False
    ids = tensors[0]
    if ids.dim() != 2 or ids.is_floating_point() or len(ids) < 64:
        return False
    lengths = (ids != pad).sum(1).float()
    if float(lengths.std()) == 0:
        return False
    steps = lengths[1:] - lengths[:-1]
    return float((steps >= 0).float().mean()) >= 0.99 or float((steps <= 0).float().mean()) >= 0.99


SHUFFLE_TOLERANCE = 1e-5  # relative change of the loss under shuffled token positions: none


JITTER = 0.05  # absolute noise added to every weight of a copy of the model


def _same_loss(before: float | None, after: float | None) -> bool:
    return before is not None and after is not None and math.isfinite(before) and \
        abs(after - before) <= SHUFFLE_TOLERANCE * max(abs(before), 1.0)


def reads_a_bag(ctx: PreflightContext) -> BagReading | None:
    """How the model reads a (B, T) token batch when its loss is unchanged by one shuffle of
    the token positions (an EmbeddingBag, or embeddings mean-pooled without positions); None
    when the order matters, or there is no such batch."""
    from optimus_preflight.preflight.analyses.eval_forward import eval_forward, loss_value

    batch = ctx.artifacts.first_batch
    if not isinstance(batch, (list, tuple)) or len(batch) != 2 or not isinstance(batch[0], torch.Tensor):
        return None
    ids = batch[0]
    if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool or ids.shape[1] < MIN_SEQUENCE:
        return None
    order = torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(0))
    shuffled = (ids[:, order.to(ids.device)], batch[1])
    try:
        if not _same_loss(loss_value(eval_forward(ctx, batch)), loss_value(eval_forward(ctx, shuffled))):
            return None
        # Again with every weight jittered: a position table that starts at zero (learned positions
        # initialised to 0) reads no order at init, yet the model is built to learn it.
        jittered = copy.deepcopy(ctx.model).to(ctx.device)
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for parameter in jittered.parameters():
                if parameter.is_floating_point():
                    parameter.add_(JITTER * torch.randn(parameter.shape, generator=generator).to(parameter.device))
            jittered.eval()
            with ctx.training.plan.autocast():
                same = _same_loss(loss_value(ctx.compute_loss(jittered, move_to_device(batch, ctx.device))),
                                  loss_value(ctx.compute_loss(jittered, move_to_device(shuffled, ctx.device))))
    except Exception:
        return None
    if not same:
        return None
    last = ids[:, -1]
    pad_value = int(torch.mode(last).values)
    trailing = int((last == pad_value).sum())
    full = trailing < 0.5 * len(last)
    pad = None if full else pad_value
    common = commonest_id(ids, pad)
    return BagReading(rows=int(ids.shape[0]), width=int(ids.shape[1]), full=full,
                      common_id=common[0] if common else None, common_share=common[1] if common else 0.0,
                      sorted_by_length=stored_by_length(getattr(ctx.train_loader, "dataset", None), pad))


def bag_hints(bag: BagReading) -> str:
    """What the token ids themselves show beside texts unrelated to their labels."""
    hints = ""
    if bag.sorted_by_length:
        hints += (" The training texts are stored in order of length (a sort for bucketing, docs.sort(key=len)): "
                  "sorting the texts without their labels pairs each text with another text's label")
    if bag.common_id is not None:
        hints += (f" Id {bag.common_id} is {bag.common_share:.0%} of the tokens, far commoner than any other: if it is "
                  "the unknown-word id (<unk>), the words that decide the label are missing from the vocabulary and "
                  "all read as one token (a vocabulary built on text.lower() looked up with the original casing, or "
                  "built from another corpus or tokenizer)")
    return hints


def conflicting_labels(digests: list[str], labels: torch.Tensor) -> tuple[int, int]:
    """(samples whose identical-input twins carry another label, groups of them) (pure)."""
    seen: dict[str, set[int]] = {}
    counts: dict[str, int] = {}
    for digest, label in zip(digests, labels.tolist(), strict=True):
        seen.setdefault(digest, set()).add(int(label))
        counts[digest] = counts.get(digest, 0) + 1
    groups = [digest for digest, found in seen.items() if len(found) > 1]
    return sum(counts[digest] for digest in groups), len(groups)


@dataclass
class LabelShift:
    distance: float  # total variation between the two label histograms
    train: dict[int, float]  # class -> share
    val: dict[int, float]
    val_count: int
    train_count: int = 0
    # Validation classes no training label names although, at their validation share, the
    # training labels read would hold UNTRAINED_EXPECTED of them: a class whose samples were
    # given another label in training (a folder missing from the label map, a .get() default).
    untrained: tuple[int, ...] = ()


def _same_layout(train_batch: Any, val_batch: Any) -> bool:
    """Whether the last tensor of a validation batch can be the training batch's labels: a
    training batch ``(x, y, domain)`` beside a validation batch ``(x, y)`` ends in other things."""
    if isinstance(train_batch, (list, tuple)) and isinstance(val_batch, (list, tuple)):
        return len(train_batch) == len(val_batch)
    return True


def _dataset_length(loader: Any) -> float:
    try:
        return len(loader.dataset)
    except (TypeError, AttributeError, NotImplementedError):
        return math.inf


def untrained_classes(p: dict[int, float], q: dict[int, float], train_count: int, val_count: int) -> tuple[int, ...]:
    """Validation classes absent from the training labels where chance cannot explain it, while
    the classes both splits share still hold most of the validation labels: a protocol that
    validates on classes held out on purpose (metric learning's disjoint classes) shares none."""
    absent = tuple(c for c, share in q.items() if c >= 0 and share > 0 and p.get(c, 0.0) == 0.0
                   and share * val_count >= MIN_CLASS_SAMPLES and share * train_count >= UNTRAINED_EXPECTED)
    shared = sum(share for c, share in q.items() if p.get(c, 0.0) > 0)
    return absent if absent and shared >= UNTRAINED_SHARED else ()


def label_shift(train_y: torch.Tensor, val_y: torch.Tensor, with_untrained: bool = False) -> LabelShift | None:
    """The validation labels distributed unlike the training labels (pure): total variation
    of SHIFT_DISTANCE or more, one class only where training has several, or (``with_untrained``)
    a validation class training never names."""
    if len(train_y) < MIN_TRAIN or len(val_y) < MIN_VAL:
        return None
    classes = sorted(set(train_y.tolist()) | set(val_y.tolist()))
    if len(classes) < 2 or len(classes) > MAX_CLASSES:
        return None
    p = {c: float((train_y == c).float().mean()) for c in classes}
    q = {c: float((val_y == c).float().mean()) for c in classes}
    distance = 0.5 * sum(abs(p[c] - q[c]) for c in classes)
    one_class = sum(1 for c in classes if q[c] > 0) == 1 and max(p.values()) < ONE_CLASS_TRAIN_MAX
    untrained = untrained_classes(p, q, len(train_y), len(val_y))
    if distance < SHIFT_DISTANCE and not one_class and not (untrained and with_untrained):
        return None
    return LabelShift(distance, {c: v for c, v in p.items() if v}, {c: v for c, v in q.items() if v}, len(val_y),
                      len(train_y), untrained)


@dataclass
class Relabelling:
    train_agreement: float  # of training samples with their nearest other training sample
    val_agreement: float  # of validation samples with their nearest training sample
    relabelled_agreement: float  # the same, with each validation id read as its best training id
    mapping: dict[int, int]  # validation id -> the training id its samples' neighbours carry
    majority: float  # the largest training class's share
    val_within: float | None = None  # of validation samples with their nearest other validation sample

    @property
    def scrambled(self) -> bool:
        """Training labels at chance beside their inputs while validation's follow theirs: the
        inputs do carry the labels, and the training split lost the pairing."""
        return (self.val_within is not None and self.train_agreement <= self.majority + SCRAMBLED_MARGIN
                and self.val_within >= self.train_agreement + DROP and self.val_within >= self.majority + DROP)

    @property
    def relabelled(self) -> bool:
        moved = {v: t for v, t in self.mapping.items() if v != t}
        return (self.train_agreement >= self.majority + ABOVE_MAJORITY
                and self.val_agreement <= self.train_agreement - DROP
                and self.relabelled_agreement >= self.train_agreement - RESTORED
                and len(moved) >= 2)


def _embed(train: torch.Tensor, val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = train.mean(0), train.std(0).clamp_min(1e-6)
    train, val = (train - mean) / std, (val - mean) / std
    if train.shape[1] > PROJECTED_DIM:
        projection = torch.randn(train.shape[1], PROJECTED_DIM, generator=torch.Generator().manual_seed(0))
        train, val = train @ projection, val @ projection
    return train, val


def relabelling(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor,
                val_y: torch.Tensor) -> Relabelling | None:
    """Nearest-neighbour label agreement within training and from validation to training
    (pure)."""
    classes = torch.unique(train_y)
    if len(train_y) < MIN_TRAIN or len(val_y) < MIN_VAL or not 2 <= len(classes) <= MAX_CLASSES:
        return None
    train_x, val_x = _embed(train_x, val_x)
    within = torch.cdist(train_x, train_x)
    within.fill_diagonal_(float("inf"))
    train_agreement = float((train_y[within.argmin(1)] == train_y).float().mean())
    neighbour = train_y[torch.cdist(val_x, train_x).argmin(1)]
    val_agreement = float((neighbour == val_y).float().mean())
    mapping, agreeing = {}, 0
    for label in torch.unique(val_y).tolist():
        picked = neighbour[val_y == label]
        best, count = torch.mode(picked).values, int((picked == torch.mode(picked).values).sum())
        agreeing += count
        if len(picked) >= MIN_CLASS_SAMPLES:
            mapping[int(label)] = int(best)
    majority = float(torch.bincount(train_y - int(train_y.min())).max()) / len(train_y)
    among_val = torch.cdist(val_x, val_x)
    among_val.fill_diagonal_(float("inf"))
    val_within = float((val_y[among_val.argmin(1)] == val_y).float().mean())
    return Relabelling(train_agreement, val_agreement, agreeing / len(val_y), mapping, majority, val_within)


ORDERED_SAMPLES = 2048  # training samples read in dataset order to look for labels one row off
OFFSET_GAIN = 0.2  # of nearest-neighbour agreement the offset pairing must win (and come within of validation's)


def string_sorted_ids(mapping: dict[int, int], classes: int) -> tuple[str, str, str] | None:
    """(the split indexed by names sorted as strings, how they sort, the other split) when the
    validation -> training id mapping is exactly the one between numeric and string order of
    the names 0..K-1 or 1..K (folders '1'..'12' read by ImageFolder in one split, int(name) in
    the other); None otherwise."""
    if classes < 10 or len(mapping) < 3:
        return None
    for start in (0, 1):
        names = [str(start + i) for i in range(classes)]
        lexical = sorted(names)
        numeric_to_lexical = {i: lexical.index(names[i]) for i in range(classes)}
        shown = ", ".join(f"'{n}'" for n in lexical[:5]) + ", ..."
        if all(numeric_to_lexical.get(v) == t for v, t in mapping.items()):
            return "training", shown, "validation"
        if all(numeric_to_lexical.get(t) == v for v, t in mapping.items()):
            return "validation", shown, "training"
    return None


def class_mappings(dataset: Any, depth: int = 0) -> list[dict[str, int]]:
    """The ``class_to_idx`` dicts of a dataset and the datasets inside it (ConcatDataset's
    parts, a Subset's dataset), in order."""
    if dataset is None or depth > 4:
        return []
    mapping = getattr(dataset, "class_to_idx", None)
    if isinstance(mapping, Mapping) and mapping and all(isinstance(v, int) for v in mapping.values()):
        return [dict(mapping)]
    found: list[dict[str, int]] = []
    for inner in getattr(dataset, "datasets", None) or [getattr(dataset, "dataset", None)]:
        found += class_mappings(inner, depth + 1)
    return found


class SplitLabelsCheck(Check):
    """VAL_LABEL_MAPPING: validation ids that name other classes than the same ids in training;
    VAL_LABEL_SHIFT: validation labels distributed unlike the training labels; LABEL_CONFLICT:
    identical training inputs with different labels."""

    name = "data.split_labels"
    stage = Stage.DATA
    codes = ("VAL_LABEL_MAPPING", "VAL_LABEL_SHIFT", "LABEL_CONFLICT", "LABELS_UNRELATED", "VAL_CHANNEL_ORDER",
             "TRAIN_ONLY_SHORTCUT", "VAL_COLUMNS_RECODED", "CLASS_TO_IDX_MISMATCH", "VAL_CLASS_UNTRAINED", "VAL_UNLIKE_TRAINING")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        self._class_mappings(ctx, findings)
        if labels_only(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "not a (inputs, class labels) batch"
            if ctx.val_loader is not None and ids_and_tags(ctx.artifacts.first_batch) is not None:
                self._token_tags(ctx, findings)
            elif ctx.val_loader is not None and masked_labels(ctx.artifacts.first_batch) is not None:
                self._masked_shift(ctx, findings)
            return
        train = self._read(ctx, findings, ctx.train_loader, TRAIN_SAMPLES, "training")
        if train is not None and train[2] and not ids_only(ctx.artifacts.first_batch):
            self._conflicts(train[2], train[1], findings)
        if train is not None and train[0] is not None:
            pair = inputs_beside_labels(ctx.artifacts.first_batch)
            self._signal(train[0], train[1], findings, erased=sample_normalisation(pair[0]) if pair is not None else None)
        elif train is not None and train[4] is not None:
            self._signal(train[4], train[1], findings, text=True, bag=reads_a_bag(ctx))
        if ctx.val_loader is None:
            findings.data.setdefault("summary", "no validation loader")
            return
        val = self._read(ctx, findings, ctx.val_loader, VAL_SAMPLES, "validation")
        if train is None or val is None:
            findings.data["summary"] = "too few samples"
            return
        shortcut = (train_only_shortcut(train[0], train[1], val[0], val[1])
                    if train[0] is not None and val[0] is not None else None)
        found = None
        if train[0] is not None and val[0] is not None and train[0].shape[1] == val[0].shape[1]:
            if scale_mismatch(train[0], val[0]) is not None:
                # Inputs preprocessed unlike training's move every neighbour: data.split_scale names that,
                # and no relabelling is to be read from it.
                self._shortcut(shortcut, findings)
                findings.data["summary"] = "validation inputs on another scale (data.split_scale)"
                return
            found = relabelling(train[0], train[1], val[0], val[1])
        if found is None or not found.relabelled:
            # Relabelled validation classes make any class's statistics look train-only: that is the mapping.
            self._shortcut(shortcut, findings)
        if found is None or not found.relabelled:
            self._shift(ctx, train[1], val[1], findings)
        # Training labels unrelated to their texts change every column's relation to them: that is
        # the training split's pairing, not a validation vocabulary.
        unrelated = any(issue.code == "LABELS_UNRELATED" and issue.severity.value == "warning" for issue in findings.issues)
        if found is None:
            if train[0] is None and train[4] is not None and val[4] is not None and not unrelated:
                self._recoded(relation_change(train[4], train[1], val[4], val[1]), findings, text=True)
            findings.data.setdefault("summary", "too few samples or classes to compare")
            return
        findings.data.update(train_agreement=round(found.train_agreement, 3),
                             val_agreement=round(found.val_agreement, 3),
                             relabelled_agreement=round(found.relabelled_agreement, 3))
        findings.data["summary"] = (f"nearest-neighbour label agreement {found.train_agreement:.0%} within training, "
                                    f"{found.val_agreement:.0%} from validation")
        if self._channel_order(train, val, found, findings):
            return
        if found.scrambled:
            self._scrambled(found, findings, self._neighbour_offset(ctx, findings, found))
            return
        if not found.relabelled:
            # Continuous inputs whose classes moved to where training has others went through
            # another pipeline (a sample rate, a resize); columns recoded per split are codes and
            # one-hot columns. (An ignored label, -100, is no class a neighbour can carry.)
            changed = relation_change(train[0], train[1], val[0], val[1])
            columns = [c.column for c in changed.changed] if changed is not None else list(range(train[0].shape[1]))
            coded = bool((train[0][:, columns] == train[0][:, columns].round()).all())
            unlike = (found.val_agreement <= found.train_agreement - UNLIKE_DROP and bool((train[1] >= 0).all())
                      and not coded)
            if unlike and not any(issue.severity.value == "warning" for issue in findings.issues) \
                    and not self._model_knows_validation(ctx, found, findings):
                self._unlike_training(found, findings)
            elif coded and not any(issue.code == "VAL_CLASS_UNTRAINED" for issue in findings.issues):
                # (a class folded into another in training changes that class's columns: already named).
                # Only code and one-hot columns are recoded per split: continuous columns that relate to
                # the labels otherwise in validation are another task or a drift (continual learning
                # validates on the old task on purpose).
                self._recoded(changed, findings, names=feature_names(ctx.artifacts.first_batch))
            return
        moved = ", ".join(f"{v} -> {t}" for v, t in sorted(found.mapping.items()) if v != t)
        classes = int(max(int(train[1].max()), int(val[1].max()))) + 1
        string_order = string_sorted_ids(found.mapping, classes)
        if string_order is not None:
            cause = (f"The ids follow the class names sorted as strings in {string_order[0]} ({string_order[1]}) and "
                     f"their numeric order in {string_order[2]}: ImageFolder's class_to_idx and Keras' "
                     "image_dataset_from_directory sort folder names as strings, so '10' comes before '2', while the "
                     "other split was indexed with int(name). Most classes are scored against another class's id")
            fix = ("Use one mapping for every split: reuse the training dataset's class_to_idx (or sort the names with "
                   "key=int for both), or name the folders with zero padding ('01', '02', ..., '12').")
        else:
            cause = ("The label encoding was built per split (sorted(set(labels)).index or a LabelEncoder fitted on "
                     "each split, ImageFolder roots with different class folders): a class missing from one split "
                     "shifts every id after it, and the validation score measures the wrong classes")
            fix = ("Build the class -> id mapping once, from the training labels or the full class list, and apply "
                   "that same mapping to every split (LabelEncoder().fit(train_labels), then .transform on each split).")
        findings.warning(
            "VAL_LABEL_MAPPING",
            f"the validation labels use other class ids than the training labels: a training sample's nearest "
            f"training neighbour has its label {found.train_agreement:.0%} of the time, a validation sample's only "
            f"{found.val_agreement:.0%}, and {found.relabelled_agreement:.0%} once the validation ids are read as "
            f"training ids {moved}. {cause}",
            fix,
            "data.val",
        )

    def _neighbour_offset(self, ctx: PreflightContext, findings: Findings, found: Relabelling) -> int | None:
        """The offset k for which the training inputs in dataset order agree with the labels of
        sample i + k about as well as the validation pairs do: rows flattened from sequences (a
        trajectory's states beside the next step's actions) with the labels one row off."""
        dataset = getattr(ctx.train_loader, "dataset", None)
        if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            return None
        parts = read_samples(ctx, self.name, findings, ordered_loader(ctx.train_loader), f"training samples in order for {self.name}",
                             features_and_labels, ORDERED_SAMPLES, SCAN_BUDGET_S)
        if not parts:
            return None
        features, labels = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        for offset in (1, -1):
            x, y = (features[:-1], labels[1:]) if offset == 1 else (features[1:], labels[:-1])
            shifted = relabelling(x, y, x, y)
            if shifted is not None and shifted.train_agreement >= found.train_agreement + OFFSET_GAIN \
                    and shifted.train_agreement >= found.val_within - OFFSET_GAIN:
                findings.data["label_offset"] = offset
                return offset
        return None

    @staticmethod
    def _scrambled(found: Relabelling, findings: Findings, offset: int | None = None) -> None:
        findings.data["validation_within_agreement"] = round(found.val_within, 3)
        # the probes' finding on the training split alone says less: validation shows the pairing was lost
        findings.issues[:] = [issue for issue in findings.issues if issue.code != "LABELS_UNRELATED"]
        if offset is not None:
            findings.warning(
                "LABELS_UNRELATED",
                f"the training labels are off by one row: in dataset order, inputs[i] agrees with labels[i {'+' if offset > 0 else '-'} 1] "
                f"as well as the validation pairs agree with theirs, while a training sample's nearest neighbour has its "
                f"own label only {found.train_agreement:.0%} of the time (validation: {found.val_within:.0%}). Rows "
                "flattened from sequences were paired with the neighbouring step's label: a trajectory's states beside "
                "the next step's actions (s_t with a_{t+1}: actions[:, 1:] against states[:, :-1] sliced the wrong "
                "way), or a label column shifted one row against its features",
                "Pair each row with its own step: states[:, t] with actions[:, t] (slice both with the same range, "
                "e.g. states[:, :-1] and actions[:, :-1] when the last state has no action); check a few rows by hand.",
                "data.train",
            )
            return
        findings.warning(
            "LABELS_UNRELATED",
            f"the training labels are unrelated to their inputs while the validation labels follow theirs: a "
            f"validation sample's nearest validation neighbour has its label {found.val_within:.0%} of the time, a "
            f"training sample's nearest training neighbour only {found.train_agreement:.0%} (the largest class is "
            f"{found.majority:.0%}: chance). The inputs carry the labels, and the training split lost the pairing of "
            "inputs[i] with labels[i]: feature files enumerated with os.listdir or glob (an arbitrary file-system "
            "order) beside labels read from a list or CSV sorted by file name, features and labels shuffled or "
            "filtered separately, or a label list built in another order than the samples",
            "Pair each input with its label by name, not by position: sorted(os.listdir(root)) (or sorted(glob(...)))"
            " and look each label up by the file's name (labels[name]); filter and shuffle inputs and labels "
            "together. Print a few training samples with their labels and check them by hand.",
            "data.train",
        )

    @staticmethod
    def _model_knows_validation(ctx: PreflightContext, found: Relabelling, findings: Findings) -> bool:
        """Whether the model as given already answers the validation batch well above its largest
        class: validation is a task it was trained on before (continual learning scores the old
        task while training a new one), not inputs prepared another way. For ``(x, y)`` batches
        whose model maps ``x`` to class scores; False when that cannot be read."""
        guard = DataGuard(ctx, "data.split_labels", findings)
        try:
            with preserved_data_state(ctx), guard.batches(ctx.val_loader, "validation for the model's answers") as batches:
                batch = next(batches, None)
            if not isinstance(batch, (list, tuple)) or len(batch) != 2:
                return False
            x, y = move_to_device(batch, ctx.device)
            with preserved_training_state(ctx), torch.no_grad():
                ctx.model.eval()
                scores = ctx.model(x)
        except Exception:  # noqa: BLE001 - a model this probe cannot call says nothing either way
            return False
        if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or len(scores) != len(y) \
                or scores.shape[1] <= int(y.max()):
            return False
        accuracy = float((scores.argmax(-1).cpu() == y.cpu()).float().mean())
        return accuracy >= found.majority + KNOWN_MARGIN

    @staticmethod
    def _unlike_training(found: Relabelling, findings: Findings) -> None:
        """VAL_UNLIKE_TRAINING: validation samples whose nearest training samples mostly carry
        another label, while training samples' neighbours carry theirs, and no relabelling of
        the ids brings the agreement back: the inputs of one split went through another
        pipeline. A shift between splits that a model can bridge lowers the agreement by far
        less (a held-out graph's nodes, a drifting sensor: 0.36 at most on the blind sets'
        healthy cases)."""
        findings.warning(
            "VAL_UNLIKE_TRAINING",
            f"validation samples' nearest training samples carry the same label {found.val_agreement:.0%} of the time, "
            f"against {found.train_agreement:.0%} between training samples, and no renumbering of the validation ids "
            f"brings it back ({found.relabelled_agreement:.0%} at best): the validation inputs were prepared unlike the "
            "training inputs (another sample rate or resolution, colour order, normalisation or feature pipeline; "
            "audio read without resampling, images resized or scaled differently), so each class sits where training "
            "put another, and the validation score measures inputs the model never saw",
            "Prepare both splits with one pipeline: the same loading (resample every clip to one rate, decode images "
            "in one colour order), the same transforms and normalisation statistics; print one training and one "
            "validation sample of the same class side by side to find the step that differs.",
            "data.val",
        )

    @staticmethod
    def _recoded(found: RelationChange | None, findings: Findings, text: bool = False,
                 names: list[str] | None = None) -> None:
        """VAL_COLUMNS_RECODED: columns that carry the label one way in training and another in
        validation, at unchanged scale: the columns mean other things per split. For token ids
        the columns are hashed token counts: the ids mean other words per split."""
        if found is None:
            return
        if text:
            findings.data["recoded_token_buckets"] = [c.column for c in found.changed]
            findings.warning(
                "VAL_COLUMNS_RECODED",
                f"the token ids mean other words in validation than in training: counts of {len(found.changed)} "
                f"token-id groups relate to the labels one way in training and another in validation, far beyond "
                f"sampling noise (class-vs-rest difference in standard deviations: column {found.changed[0].column}, "
                f"class {found.changed[0].label}: {found.changed[0].train_d:+.2f} in training, "
                f"{found.changed[0].val_d:+.2f} in validation). The vocabulary (word -> id) was built separately per "
                "split (a Tokenizer.fit_on_texts, Counter or build_vocab_from_iterator run on each split, ids by "
                "frequency rank), so id 7 is one word in training and another in validation, and the validation score "
                "measures the model on text it cannot read",
                "Build the vocabulary once, on the training texts, and encode every split with it (unknown words -> an "
                "<unk> id); save it with the model for serving.",
                "data.val",
            )
            return
        def name(column: int) -> str:
            return names[column] if names is not None and column < len(names) else f"column {column}"

        shown = "; ".join(f"{name(c.column)}, class {c.label}: {c.train_d:+.2f} in training, {c.val_d:+.2f} in "
                          "validation" for c in found.changed[:3])
        findings.data["recoded_columns"] = [c.column for c in found.changed]
        if names is not None:
            findings.data["recoded_column_names"] = [name(c.column) for c in found.changed]
        codes = names is not None and any("= code" in name(c.column) for c in found.changed)
        findings.warning(
            "VAL_COLUMNS_RECODED",
            f"{len(found.changed)} input column(s) relate to the labels one way in training and another in "
            f"validation, far beyond sampling noise, though their scale is unchanged (class-vs-rest mean difference "
            f"in standard deviations: {shown}; {found.carrying} column(s) carry the label in training). The columns "
            "mean other things in the two splits: one-hot (dummy) columns built separately per split (pd.get_dummies "
            "or np.unique categories of each split: a category missing from one split shifts every column after it), "
            "a category -> id table fitted per split, or columns selected or ordered per split. The validation score "
            "measures the model on features it never saw"
            + (". Here the changed columns are integer category codes: the category -> code table was built per "
               "split (pandas factorize or astype('category').cat.codes, a LabelEncoder or a dict of first "
               "appearances run on each split), so one code names another category, and another embedding row, in "
               "validation" if codes else ""),
            ("Build the category -> code table once, on the training split, and encode every split with it "
             "(pd.factorize of validation with the training uniques, or pd.Categorical(val_col, "
             "categories=train_categories).codes; LabelEncoder().fit(train_col).transform(val_col)); unseen categories "
             "get a reserved code. " if codes else "")
            + "Fit every encoding on the training split and apply that same one to validation (and test): "
            "OneHotEncoder(handle_unknown='ignore').fit(X_train_categories), then .transform on each split, or "
            "pd.get_dummies(df_val).reindex(columns=train_columns, fill_value=0); one fixed column list for all splits.",
            "data.val",
        )

    @staticmethod
    def _channel_order(train: tuple, val: tuple, found: Relabelling, findings: Findings) -> bool:
        """VAL_CHANNEL_ORDER: validation images whose neighbour agreement drops, and comes back
        with the same ids once their colour channels are reversed (BGR read as RGB)."""
        flipped = val[3]
        if flipped is None or train[0] is None or flipped.shape[1] != train[0].shape[1] \
                or found.val_agreement > found.train_agreement - DROP:
            return False
        again = relabelling(train[0], train[1], flipped, val[1])
        if again is None or again.val_agreement < found.train_agreement - RESTORED:
            return False
        findings.data["channel_reversed_agreement"] = round(again.val_agreement, 3)
        findings.warning(
            "VAL_CHANNEL_ORDER",
            f"the validation images come in the other colour channel order than the training images: a training "
            f"image's nearest training neighbour has its label {found.train_agreement:.0%} of the time, a validation "
            f"image's only {found.val_agreement:.0%}, and {again.val_agreement:.0%} once the validation images' "
            "channels are reversed, with the same label ids. One pipeline reads BGR (cv2.imread) and the other RGB "
            "(PIL, torchvision): colours the classes depend on are swapped (red read as blue), and what the model "
            "learns is judged on other colours than it saw",
            "Convert to one order in every split, at load time: cv2.cvtColor(image, cv2.COLOR_BGR2RGB) (or "
            "image[..., ::-1]) where cv2 reads the images; the same conversion at serving time.",
            "data.train",
        )
        return True

    @staticmethod
    def _conflicts(digests: list[str], labels: torch.Tensor, findings: Findings) -> None:
        if len(digests) != len(labels):
            return
        conflicted, groups = conflicting_labels(digests, labels)
        findings.data.update(conflicting_samples=conflicted, conflicting_groups=groups)
        if conflicted < MIN_CONFLICTS or conflicted < CONFLICT_SHARE * len(labels):
            return
        findings.warning(
            "LABEL_CONFLICT",
            f"{conflicted} of the {len(labels)} training samples read ({conflicted / len(labels):.0%}) have identical "
            f"inputs to another sample with a different label ({groups} groups of identical inputs, conflicting "
            "labels): no model can tell them apart. Usually the preprocessing destroys what separates them: a "
            "stop-word list that drops negations ('not good' -> 'good'), truncation to a shared prefix, lower-casing "
            "or bucketing that merges distinct values; else the labels are noisy",
            "Encode a conflicting pair by hand and compare it with the raw text or rows: keep the tokens that carry "
            "the label (negations out of the stop list, a longer max_length, finer buckets); drop or relabel true "
            "duplicates.",
            "data.train",
        )

    @staticmethod
    def _signal(features: torch.Tensor, labels: torch.Tensor, findings: Findings, text: bool = False,
                bag: BagReading | None = None, erased: str | None = None) -> None:
        signal = label_signal(features, labels)
        if signal is None:
            return
        findings.data.update(neighbour_accuracy=round(signal.neighbour_accuracy, 3),
                             linear_accuracy=round(signal.linear_accuracy, 3), majority_share=round(signal.majority, 3))
        if not signal.unrelated:
            return
        if text and bag is not None:
            # The model reads the tokens as a bag, so "the label depends on the order" cannot be why
            # the counts say nothing: what the model can learn from is unrelated to the labels.
            cut = (f" Every one of the {bag.rows} sequences of the first batch fills all {bag.width} positions with no "
                   f"padding: if the texts were cut to max_length={bag.width}, truncation keeps the start by default, "
                   "and whatever decides the label after it (a review's verdict at its end, a ticket's resolution) "
                   "never reaches the model" if bag.full else "")
            findings.warning(
                "LABELS_UNRELATED",
                f"the words of the training texts say nothing about their labels, and the model reads them as a bag "
                f"(its loss does not change when the token positions are shuffled): over {signal.samples} samples "
                f"read, a 5-nearest-neighbour vote and a linear probe on hashed token counts predict "
                f"{signal.neighbour_accuracy:.0%} and {signal.linear_accuracy:.0%} of them, no better than always "
                f"answering the largest class ({signal.majority:.0%}), so the model has nothing to learn from. "
                "Usually the labels were joined to the texts wrongly: two sources merged whose labels mean opposite "
                "things (1 = positive in one export, 1 = complaint in the other) without recoding one, or texts and "
                f"labels sorted, shuffled or filtered apart.{cut}{bag_hints(bag)}",
                ("Keep the part of each text that carries the label: truncate from the left (tokenizer("
                 "truncation_side='left'), or ids[-max_length:]) or raise max_length; " if bag.full else "")
                + "print a few texts with their labels and check them by hand: texts and labels joined in the same "
                "order, one label coding for every source.",
                "data.train",
            )
            return
        if text:
            # Counts of words cannot see order, and many sequence tasks are about order alone: a note.
            findings.info(
                "LABELS_UNRELATED",
                f"the words of the training texts say nothing about their labels: over {signal.samples} samples read, "
                f"a 5-nearest-neighbour vote and a linear probe on hashed token counts predict {signal.neighbour_accuracy:.0%} "
                f"and {signal.linear_accuracy:.0%} of them, no better than always answering the largest class "
                f"({signal.majority:.0%}). Expected when the label depends on the order of the tokens; for a "
                "bag-of-words task (topic, sentiment, intent) the labels were joined to the texts wrongly: two sources "
                "merged whose labels mean opposite things without recoding one, or texts and labels sorted or "
                "filtered apart",
                "Print a few texts with their labels and check them by hand; map every source's labels to one "
                "coding before merging.",
                "data.train",
            )
            return
        probe = "a linear probe"
        causes = (
            "Usually the labels were joined to the texts wrongly: two sources merged whose labels mean opposite "
            "things (1 = positive in one export, 1 = complaint in the other) without recoding one, texts and labels "
            "read from files sorted differently, or one list shuffled or filtered on its own"
            if text else
            "Usually features and labels were misaligned on the way: rows filtered from the features only "
            "(X = X[~np.isnan(X).any(1)] or X = df[cols].dropna(), then y = y[:len(X)]), an off-by-one slice (X[:-1] with y[:-1] shifted), "
            "features and labels shuffled separately (two np.random.shuffle calls: two different permutations), one "
            "of them sorted on its own, or inputs and label files paired by two directory listings in different "
            "orders (os.listdir and glob return an arbitrary order: one listing sorted, the other not). Else the preprocessing removed what carries the label: each "
            "sample standardised with its own mean and std (its level, often the label's cause, is gone), a feature "
            "dropped or overwritten")
        if erased is not None:
            causes = (f"The inputs were normalised sample by sample: {erased}, so a label that depends on it can no "
                      "longer be read from them. " + causes)
        findings.warning(
            "LABELS_UNRELATED",
            f"the training labels look unrelated to their inputs: over {signal.samples} samples read, a 5-nearest-"
            f"neighbour vote predicts {signal.neighbour_accuracy:.0%} of them and {probe} "
            f"{signal.linear_accuracy:.0%}, no better than always answering the largest class "
            f"({signal.majority:.0%}). {causes}",
            "Pair each input with its label by name, not by position (sorted() both listings, or join on the file "
            "stem); filter, shuffle and slice inputs and labels together (one DataFrame, or one index: perm = "
            "np.random.permutation(len(X)); X, y = X[perm], y[perm], or mask = ...; X, y = X[mask], y[mask]); map every source's labels to one coding before merging; normalise with "
            "statistics of the training set, not of each sample. Print a few rows with their labels and check them "
            "by hand.",
            "data.train",
        )

    @staticmethod
    def _shortcut(found: Shortcut | None, findings: Findings) -> None:
        if found is None:
            return
        findings.data["shortcut"] = {"label": found.label, "statistic": found.statistic,
                                     "train_auc": round(found.train_auc, 3), "val_auc": round(found.val_auc, 3)}
        side = "larger" if found.higher else "smaller"
        findings.warning(
            "TRAIN_ONLY_SHORTCUT",
            f"in training, the samples of class {found.label} have a {side} per-sample {found.statistic} than the "
            f"rest, enough to tell them apart without looking at the content (AUC {found.train_auc:.2f}); in "
            f"validation it tells them apart far less (AUC {found.val_auc:.2f}). Something done to the training "
            "rows of that class only (noise or augmentation added to the oversampled minority copies, one class "
            "rescaled, resampled or read from another source) is a shortcut the model learns instead of the task, "
            "and it fails on validation, where the class looks like the others",
            "Apply augmentation and preprocessing to every class alike (augment the whole training set, or "
            "oversample with a WeightedRandomSampler instead of noisy copies of one class), and compare a few "
            "samples of each class side by side.",
        )

    def _token_tags(self, ctx: PreflightContext, findings: Findings) -> None:
        """VAL_LABEL_MAPPING for per-token tags: the validation tag ids renumbered."""
        read = [self._read_tags(ctx, findings, loader, limit, which)
                for loader, limit, which in ((ctx.train_loader, TRAIN_SAMPLES, "training"),
                                             (ctx.val_loader, VAL_SAMPLES, "validation"))]
        if read[0] is None or read[1] is None:
            return
        found = tag_renumbering(*read[0], *read[1])
        if found is None:
            findings.data["summary"] = "too few tagged tokens to compare"
            return
        renumbered = Relabelling(*found)
        findings.data.update(train_agreement=round(renumbered.train_agreement, 3),
                             val_agreement=round(renumbered.val_agreement, 3),
                             relabelled_agreement=round(renumbered.relabelled_agreement, 3))
        findings.data["summary"] = (f"a token's usual training tag matches {renumbered.train_agreement:.0%} of held-out "
                                    f"training tags, {renumbered.val_agreement:.0%} of validation tags")
        if not renumbered.relabelled:
            return
        moved = ", ".join(f"{v} -> {t}" for v, t in sorted(renumbered.mapping.items()) if v != t)
        findings.warning(
            "VAL_LABEL_MAPPING",
            f"the validation tags use other ids than the training tags: the tag a token usually carries in training "
            f"matches its tag at {renumbered.train_agreement:.0%} of held-out training positions, at only "
            f"{renumbered.val_agreement:.0%} of validation positions, and at {renumbered.relabelled_agreement:.0%} "
            f"once the validation ids are read as training ids {moved}. The tag -> id mapping (label2id) was built "
            "separately for each split (ids in the order each split meets its tags, or sorted from each split's own "
            "tag set), so one tag has different ids in the two loaders and validation scores a permuted tag set",
            "Build label2id once, from the training tags or the full tag list of the scheme (B-PER, I-PER, ...), "
            "and encode every split with that same mapping.",
            "data.val",
        )

    def _read_tags(self, ctx: PreflightContext, findings: Findings, loader: Any, limit: int,
                   which: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        guard = DataGuard(ctx, self.name, findings)
        ids, tags, started = [], [], time.perf_counter()
        with preserved_data_state(ctx), guard.batches(loader, f"{which} tags for {self.name}") as stream:
            for batch in stream:
                found = ids_and_tags(batch)
                if found is None or (ids and found[0].shape[1] != ids[0].shape[1]):
                    break  # padded per batch to another length: compared batch by batch would need realigning
                ids.append(found[0])
                tags.append(found[1])
                if sum(len(x) for x in ids) >= limit or time.perf_counter() - started > SCAN_BUDGET_S:
                    break
        if not ids:
            return None
        return torch.cat(ids)[:limit], torch.cat(tags)[:limit]

    @staticmethod
    def _class_mappings(ctx: PreflightContext, findings: Findings) -> None:
        """Datasets of the ImageFolder contract (a ``class_to_idx`` dict) joined or split so that
        one class name has two indices: each folder tree numbers its own sorted class folders,
        so a tree missing a class shifts every class after it."""
        parts = [(f"training part {n}", m) for n, m in enumerate(class_mappings(getattr(ctx.train_loader, "dataset", None)))]
        if ctx.val_loader is not None:
            parts += [("validation" if n == 0 else f"validation part {n}", m)
                      for n, m in enumerate(class_mappings(getattr(ctx.val_loader, "dataset", None)))]
        for position, (first_name, first) in enumerate(parts):
            for second_name, second in parts[position + 1:]:
                differ = sorted(name for name in set(first) & set(second) if first[name] != second[name])
                if not differ:
                    continue
                shown = ", ".join(f"'{name}': {first[name]} vs {second[name]}" for name in differ[:4])
                missing = sorted(set(first) ^ set(second))
                findings.warning(
                    "CLASS_TO_IDX_MISMATCH",
                    f"the {first_name} and the {second_name} datasets number the same classes differently "
                    f"(class_to_idx {shown}): every sample of those classes in one of them carries another class's "
                    "index. ImageFolder numbers the sorted class folders it finds, so a folder tree missing a class "
                    f"({', '.join(repr(m) for m in missing[:3]) or 'one with other folders'}) shifts every class "
                    "after it",
                    "Give every dataset one mapping: ImageFolder(root, ...) subclassed with find_classes returning the "
                    "first tree's classes and class_to_idx (or pass class_to_idx=first.class_to_idx to a dataset "
                    "that takes it), before joining them with ConcatDataset.",
                    "data.train",
                )
                return

    def _masked_shift(self, ctx: PreflightContext, findings: Findings) -> None:
        """VAL_LABEL_SHIFT between the labels each split's mask selects (a whole graph a batch)."""
        guard = DataGuard(ctx, self.name, findings)
        with preserved_data_state(ctx), guard.batches(ctx.val_loader, f"validation labels for {self.name}") as stream:
            val = next((masked_labels(batch) for batch in stream), None)
        train = masked_labels(ctx.artifacts.first_batch)
        if train is None or val is None or len(train) < MIN_VAL or len(val) < MIN_VAL:
            return
        findings.data["summary"] = f"{len(train)} training and {len(val)} validation labels under their masks"
        self._shift(ctx, train, val, findings)

    @staticmethod
    def _shift(ctx: PreflightContext, train_y: torch.Tensor, val_y: torch.Tensor, findings: Findings) -> None:
        sampler = getattr(ctx.train_loader, "sampler", None)
        if sampler is not None and not isinstance(sampler, (RandomSampler, SequentialSampler)):
            return  # a weighted or custom sampler reshapes the training labels on purpose
        def shares(hist: dict[int, float]) -> str:
            top = sorted(hist.items(), key=lambda item: -item[1])[:5]
            return ", ".join(f"{c}: {v:.0%}" for c, v in top) + (", ..." if len(hist) > 5 else "")
        # A class folded into another one in training also inflates that class: read the
        # missing class first, or its fold into class 0 would read as unlabelled rows filled with 0.
        shift = label_shift(train_y[train_y >= 0], val_y[val_y >= 0], with_untrained=True)
        # An unshuffled loader's first labels are no sample of the rest (a class-sorted table).
        sampled = isinstance(sampler, RandomSampler) or len(train_y) >= _dataset_length(ctx.train_loader)
        if shift is not None and shift.untrained and shift.distance < SHIFT_DISTANCE and sampled:
            named = ", ".join(f"class {c} ({shift.val[c]:.0%})" for c in shift.untrained[:5])
            findings.warning(
                "VAL_CLASS_UNTRAINED",
                f"validation labels name {named} of {shift.val_count}, but none of the {shift.train_count} training "
                f"labels read does (training {shares(shift.train)}): that class's training samples carry another "
                "label (a folder or category name missing from the label map and caught by a default, "
                "label_to_index.get(name, unknown)), or never made it into the training set (a subset or replay "
                "buffer cut from the first rows of a class-sorted table), so the model is never shown the class it is "
                "scored on",
                "Give every class its own id in the training labels: build the label map from every folder / category "
                "name and look names up with label_to_index[name] (a KeyError beats a silent default); draw subsets "
                "and replay buffers at random or per class (reservoir sampling), not the table's first rows; if the "
                "class really has no training samples, drop it from validation or split stratified by label.",
                "data.train",
            )
            return
        shift = label_shift(train_y, val_y)
        if shift is None:
            return
        ignored = sum(share for label, share in shift.val.items() if label < 0)
        zero_excess = shift.train.get(0, 0.0) - shift.val.get(0, 0.0) / max(1.0 - ignored, 1e-9)
        zero_filled = (ignored >= 0.2 and zero_excess >= 0.5 * ignored) or (
            shift.train.get(0, 0.0) >= 0.5 and shift.train.get(0, 0.0) >= 2 * shift.val.get(0, 0.0)
            and max(shift.val.values()) < 0.5)
        if zero_filled and not any(label < 0 for label in shift.train):
            marked = (f"validation marks {ignored:.0%} of its targets as ignored (negative labels: {shares(shift.val)}), "
                      "training marks none" if ignored >= 0.2 else
                      f"validation spreads its labels over the classes ({shares(shift.val)})")
            findings.warning(
                "VAL_LABEL_SHIFT",
                f"{marked}, while training labels {shift.train.get(0, 0.0):.0%} of its targets "
                f"class 0 (training {shares(shift.train)}): the unlabelled samples of the training split were filled "
                "with 0 (np.zeros / torch.zeros labels, the loss over every node or pixel) instead of the ignore "
                "index, so the model is trained to predict class 0 for everything it has no label for",
                "Give unlabelled samples the ignore index: labels = np.full(n, -100) before filling in the known "
                "ones (CrossEntropyLoss ignores -100), or compute the loss on the labelled ones only "
                "(loss = F.cross_entropy(out[train_mask], y[train_mask])).",
                "data.train",
            )
            return
        # Ignored targets (-100 for unlabelled rows) are no class: a semi-supervised split that
        # labels 3% of its training rows is not a shift. Compare the labelled rows only.
        shift = label_shift(train_y[train_y >= 0], val_y[val_y >= 0])
        if shift is None:
            return
        findings.warning(
            "VAL_LABEL_SHIFT",
            f"the validation labels are distributed unlike the training labels (total variation "
            f"{shift.distance:.2f}): validation {shares(shift.val)} of {shift.val_count}; training {shares(shift.train)}. "
            "A split cut from a file sorted by label (the last rows to validation) or by time gives each split "
            "other classes, and the validation score then measures a different task",
            "Shuffle before splitting, or split stratified by label: train_test_split(..., shuffle=True, "
            "stratify=labels), or random_split after a shuffle.",
            "data.val",
        )

    def _read(self, ctx: PreflightContext, findings: Findings, loader: Any, limit: int,
              which: str) -> tuple[torch.Tensor | None, torch.Tensor, list[str] | None, torch.Tensor | None,
                                      torch.Tensor | None] | None:
        """(features, or None when the batch has no floating features; labels; a digest of each
        sample's inputs, for the training loader; for the validation loader, the features of its
        images with the colour channels reversed, when it has images)."""
        guard = DataGuard(ctx, self.name, findings)
        features, labels, started = [], [], time.perf_counter()
        bags: list[torch.Tensor] | None = []
        flipped: list[torch.Tensor] | None = [] if which == "validation" else None
        digests: list[str] | None = [] if which == "training" else None
        with preserved_data_state(ctx), guard.batches(loader, f"{which} labels for {self.name}") as stream:
            for batch in stream:
                found = labels_only(batch)
                if found is None or (which == "validation" and not _same_layout(ctx.artifacts.first_batch, batch)):
                    return None
                labels.append(found)
                if digests is not None:
                    rows = input_digests(batch)
                    digests = digests + rows if len(rows) == len(found) else None
                pair = features_and_labels(batch)
                features.append(pair[0] if pair is not None else None)
                if bags is not None:
                    bag = token_bags(batch) if pair is None else None
                    bags = bags + [bag] if bag is not None and len(bag) == len(found) else None
                if flipped is not None:
                    reversed_batch = channel_reversed(batch)
                    reversed_pair = features_and_labels(reversed_batch) if reversed_batch is not None else None
                    flipped = flipped + [reversed_pair[0]] if reversed_pair is not None else None
                if sum(len(y) for y in labels) >= limit or time.perf_counter() - started > SCAN_BUDGET_S:
                    break
        if not labels:
            return None
        usable = all(x is not None for x in features) and len({x.shape[1] for x in features}) == 1
        return ((torch.cat(features)[:limit] if usable else None), torch.cat(labels)[:limit],
                digests[:limit] if digests else None, torch.cat(flipped)[:limit] if usable and flipped else None,
                torch.cat(bags)[:limit] if bags else None)
