"""A random horizontal flip that turns one class into another, or leaves the coordinates it
moves unchanged (``data.flip_labels``).

``RandomHorizontalFlip`` is the first augmentation everyone adds, and it is wrong wherever
the class depends on left and right: arrow or hand-signal directions, mirrored letters and
digits, left/right body parts, lane positions. A flipped "left" keeps its label "left" and
looks exactly like a "right": half of those samples are mislabelled and the two classes
become one.

Two facts, both read from the data:
- the training dataset flips at random: drawing the same index several times returns an
  image and its exact mirror (``x.flip(-1)``) with the same label;
- two classes cannot be told apart in the flipped data: a 1-nearest-neighbour vote between
  them is near chance (each holds both orientations),
  on data where nearest neighbours are meaningful: the closest image is much closer than a
  typical one (rendered signs, glyphs and sprites, not natural photos), or another pair of
  classes separates cleanly by the same vote.

``FLIP_KEEPS_COORDINATES``: the same random flip on an image whose target holds positions
(a box, a keypoint, a centre), returning the target unchanged: for the flipped half, x
points at the mirror position of the object, and the regressor learns to hedge towards the
middle. Read from the samples as served: a target column whose distance from its middle
follows the object's horizontal distance from the image's centre (a quantity the flip
leaves alone) is a horizontal coordinate; when its signed relation to the object's
position is far weaker than that, the flip moved the object and not the coordinate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import default_collate

from optimus_preflight.preflight.analyses.series import column_correlations
from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.batches import map_batch

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

PROBED_INDICES = 12
DRAWS = 4  # of each probed index: a p=0.5 flip shows both orientations with probability 7/8
MIN_FLIPPED = 3  # probed indices that came back mirrored
SAMPLES = 256  # images read for the nearest-neighbour vote
BUDGET_S = 2.0
MIN_WIDTH = 8
MIN_CLASS = 8
CHANCE = 0.7  # 1-NN accuracy between two classes at or below this in every view: one class
# The nearest image over the median distance between images: rendered, clustered
# data sits well below; natural photos sit near 1, where a pixel neighbour says little.
CLUSTERED = 0.7
SEPARATED = 0.9  # ... or another class pair separates at least this well


def image_and_label(sample: Any) -> tuple[torch.Tensor, int] | None:
    """(image (..., H, W) float, class id) of an ``(image, label)`` sample or a mapping with
    one float tensor and one integer label."""
    if isinstance(sample, (list, tuple)) and len(sample) == 2:
        image, label = sample
    elif isinstance(sample, Mapping):
        floats = [v for v in sample.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
        ints = [v for v in sample.values() if not (isinstance(v, torch.Tensor) and v.is_floating_point())]
        if len(floats) != 1 or len(ints) != 1:
            return None
        image, label = floats[0], ints[0]
    else:
        return None
    if not isinstance(image, torch.Tensor) or not image.is_floating_point() or image.dim() not in (2, 3) \
            or image.shape[-1] < MIN_WIDTH or image.shape[-2] < MIN_WIDTH:
        return None
    if isinstance(label, torch.Tensor):
        if label.numel() != 1 or label.is_floating_point():
            return None
        label = int(label)
    if not isinstance(label, int) or isinstance(label, bool):
        return None
    return image.detach().float().cpu(), label


MAX_COORDINATES = 16  # target values per sample: a box or a few keypoints, not a dense map
POSITION_TRACKED = 0.6  # |target - its middle| against |object - image centre|: a horizontal coordinate
SIGN_LOST = 0.35  # ... whose signed correlation with the object's position stays below this


def image_and_coordinates(sample: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(image (..., H, W) float, target (K,) float) of an ``(image, target)`` sample whose
    target is a few floating values (a box, a centre, keypoints)."""
    if not isinstance(sample, (list, tuple)) or len(sample) != 2:
        return None
    image, target = sample
    if not isinstance(image, torch.Tensor) or not image.is_floating_point() or image.dim() not in (2, 3) \
            or image.shape[-1] < MIN_WIDTH or image.shape[-2] < MIN_WIDTH:
        return None
    if not isinstance(target, torch.Tensor) or not target.is_floating_point() \
            or not 1 <= target.numel() <= MAX_COORDINATES:
        return None
    return image.detach().float().cpu(), target.detach().float().cpu().reshape(-1)


def horizontal_centres(images: torch.Tensor) -> torch.Tensor:
    """Each image's centre of mass along its width, weighted by how far each pixel is from the
    image's median (an object on a background, bright or dark)."""
    weights = (images - images.flatten(1).median(1).values.view(-1, *[1] * (images.dim() - 1))).abs()
    columns = weights.reshape(len(images), -1, images.shape[-1]).sum(1)
    position = torch.arange(images.shape[-1], dtype=columns.dtype)
    return (columns * position).sum(1) / columns.sum(1).clamp_min(1e-12)


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(column_correlations(a[:, None], b)[0])


@dataclass
class KeptCoordinate:
    column: int
    tracked: float  # correlation of |target - middle| with |centre - image middle|
    signed: float  # correlation of the target with the object's horizontal position


def kept_coordinate(images: torch.Tensor, targets: torch.Tensor) -> KeptCoordinate | None:
    """The target column that is a horizontal coordinate the flip did not move (pure)."""
    centres = horizontal_centres(images)
    offset = (centres - (images.shape[-1] - 1) / 2).abs()
    found = None
    for column in range(targets.shape[1]):
        values = targets[:, column]
        if float(values.std()) == 0:
            continue
        middle = (values.max() + values.min()) / 2
        tracked = _correlation((values - middle).abs(), offset)
        signed = _correlation(values, centres)
        if tracked >= POSITION_TRACKED and abs(signed) <= SIGN_LOST and (found is None or tracked > found.tracked):
            found = KeptCoordinate(column, tracked, signed)
    return found


MIRROR_CLOSER = 0.5  # a draw this much closer to the other's mirror image than to the other itself


def shows_mirror(draws: list[torch.Tensor]) -> bool:
    """Two draws of one index that are each other's horizontal mirror (and differ): exactly, or,
    with noise added after the flip, far closer to the mirror image than to the draw as given."""
    for i, first in enumerate(draws):
        for second in draws[i + 1:]:
            if first.shape != second.shape or torch.equal(first, second):
                continue
            a, b = first.float(), second.float()
            if torch.allclose(a.flip(-1), b, atol=1e-6):
                return True
            if float((a.flip(-1) - b).norm()) < MIRROR_CLOSER * float((a - b).norm()):
                return True
    return False


@dataclass
class MirrorClasses:
    first: int
    second: int
    accuracy: float  # 1-NN between the two classes, as the loader serves them


FILTERS, KERNEL = 32, 5


def shift_invariant_features(images: torch.Tensor) -> torch.Tensor:
    """(N, 2 * FILTERS) responses of fixed random 5x5 filters, max- and mean-pooled over the
    image: where a shape sits does not matter, which way it points does (random filters are not
    mirror-symmetric), so glyphs placed anywhere compare by shape."""
    x = images if images.dim() == 4 else images.unsqueeze(1)
    weight = torch.randn(FILTERS, x.shape[1], KERNEL, KERNEL, generator=torch.Generator().manual_seed(0))
    response = torch.relu(torch.nn.functional.conv2d(x.double(), weight.double(), padding=KERNEL // 2))
    features = torch.cat([response.amax(dim=(2, 3)), response.mean(dim=(2, 3))], dim=1)
    return (features - features.mean(0)) / features.std(0).clamp_min(1e-12)


def mirror_classes(images: torch.Tensor, labels: torch.Tensor) -> MirrorClasses | None:
    """The pair of classes a 1-NN vote cannot separate in the flipped data (pure), read in pixels
    and in shift-invariant shape features; None when every pair separates in a view where
    neighbours mean something, or when no view is such. Flipped with their labels swapped, or
    not flipped, left and right separate cleanly; flipped under a kept label, each class holds
    both orientations and the two are one."""
    views = [view for space in (images.reshape(len(images), -1), shift_invariant_features(images))
             if (view := _pair_accuracies(space, labels)) is not None]
    if not views:
        return None
    worst = min((pair for accuracies in views for pair in accuracies.items()), key=lambda item: item[1])[0]
    # The best any meaningful view does on that pair: one clean separation clears it.
    best = max(accuracies[worst] for accuracies in views)
    if best > CHANCE:
        return None
    return MirrorClasses(worst[0], worst[1], best)


def _pair_accuracies(vectors: torch.Tensor, labels: torch.Tensor) -> dict[tuple[int, int], float] | None:
    """The 1-NN accuracy of every class pair in this view; None when
    neighbours say little here (the nearest sample near the typical distance, and no pair
    separating cleanly)."""
    flat = vectors.double()
    distance = torch.cdist(flat, flat)
    distance.fill_diagonal_(float("inf"))
    nearest = distance.min(dim=1).values
    typical = distance[torch.isfinite(distance)].median()
    clustered = float(nearest.median() / typical.clamp_min(1e-30))
    classes = [int(c) for c, n in zip(*torch.unique(labels, return_counts=True), strict=True) if n >= MIN_CLASS]
    accuracies: dict[tuple[int, int], float] = {}
    for i, a in enumerate(classes):
        for b in classes[i + 1:]:
            keep = (labels == a) | (labels == b)
            picked = labels[keep][distance[keep][:, keep].argmin(dim=1)]
            accuracies[(a, b)] = float((picked == labels[keep]).float().mean())
    if not accuracies or (clustered > CLUSTERED and max(accuracies.values()) < SEPARATED):
        return None
    return accuracies


def _same_target(first: Any, second: Any) -> bool:
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        return first.shape == second.shape and torch.equal(first, second)
    return first == second


def probed_draws(dataset: Any, size: int, guard: DataGuard, parse: Any) -> Iterator[list[Any]]:
    """For PROBED_INDICES indices spread over the dataset, DRAWS reads of each, parsed."""
    stride = max(1, size // PROBED_INDICES)
    for index in range(0, min(size, stride * PROBED_INDICES), stride):
        yield [parse(guard.call(dataset.__getitem__, index, what=f"dataset[{index}]")) for _ in range(DRAWS)]


def channels_reversed(draws: list[torch.Tensor]) -> bool:
    """Two draws of one (C, H, W) index, C of 3 or 4, that are each other with the channel axis
    reversed (and differ): a 'horizontal flip' applied to the wrong axis."""
    for i, a in enumerate(draws):
        if a.dim() != 3 or a.shape[0] not in (3, 4):
            return False
        for b in draws[i + 1:]:
            if a.shape == b.shape and not torch.equal(a, b) and torch.allclose(a.flip(0), b, atol=1e-6):
                return True
    return False


def flipped_indices(dataset: Any, size: int, guard: DataGuard, parse: Any, channels: list[int] | None = None) -> int:
    """Of PROBED_INDICES indices drawn DRAWS times each, how many came back as an image and its
    mirror under one unchanged target (a label, or coordinates); ``parse`` reads a sample. Those
    that came back with their channels reversed instead are counted in ``channels``."""
    flipped = 0
    for draws in probed_draws(dataset, size, guard, parse):
        if any(d is None for d in draws) or not all(_same_target(d[1], draws[0][1]) for d in draws):
            continue  # a target that changes with the draw: a flip that moves it too, or noise
        flipped += shows_mirror([d[0] for d in draws])
        if channels is not None and channels_reversed([d[0] for d in draws]):
            channels.append(1)
    return flipped


def served_samples(dataset: Any, size: int, guard: DataGuard, parse: Any) -> list[tuple[Any, Any]] | None:
    """Up to SAMPLES (image, target) pairs spread over the dataset, as served; None when a
    sample does not parse or its shapes change."""
    samples, started = [], time.perf_counter()
    for index in range(0, size, max(1, size // SAMPLES)):
        pair = parse(guard.call(dataset.__getitem__, index, what=f"dataset[{index}]"))
        if pair is None or (samples and (pair[0].shape != samples[0][0].shape
                                         or getattr(pair[1], "shape", None) != getattr(samples[0][1], "shape", None))):
            return None
        samples.append(pair)
        if len(samples) >= SAMPLES or time.perf_counter() - started > BUDGET_S:
            break
    return samples


def _is_mirror(first: torch.Tensor, second: torch.Tensor) -> bool:
    return first.shape == second.shape and not torch.equal(first, second) and shows_mirror([first, second])


def mirrored_targets(dataset: Any, size: int, guard: DataGuard) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(target, target of the mirrored draw) for probed indices drawn as an image and its mirror
    with targets that differ: a random flip that moves the coordinates with the image."""
    pairs = []
    for draws in probed_draws(dataset, size, guard, image_and_coordinates):
        if any(d is None for d in draws):
            return []
        mirror = next((d for d in draws[1:] if _is_mirror(draws[0][0], d[0])), None)
        if mirror is not None and not torch.equal(mirror[1], draws[0][1]):
            pairs.append((draws[0][1], mirror[1]))
    return pairs


@dataclass
class UnswappedPair:
    first: int
    second: int
    ordered: float  # share of validation rows with first < second (or the reverse), un-augmented
    mixed: float  # share of training rows as served in the validation's order


def unswapped_pair(pairs: list[tuple[torch.Tensor, torch.Tensor]], served: torch.Tensor,
                   validation: torch.Tensor) -> UnswappedPair | None:
    """Two x coordinates the flip mirrored one by one (x -> c - x, one c for both) without
    swapping them, although they name a left and a right part: in the un-augmented validation
    targets one is left of the other in nearly every row, in the flipped pairs their order
    reverses, and the training targets as served hold both orders (pure)."""
    if len(pairs) < MIN_FLIPPED or validation.dim() != 2 or validation.shape[1] != served.shape[1]:
        return None
    before, after = torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])
    sums = before + after
    spread = (before.max(0).values - before.min(0).values).clamp_min(1e-6)
    mirrored = [k for k in range(before.shape[1]) if float(sums[:, k].std()) < 0.05 * float(spread[k])]
    for position, a in enumerate(mirrored):
        for b in mirrored[position + 1:]:
            if abs(float(sums[:, a].mean() - sums[:, b].mean())) > 0.05 * float(spread[a]):
                continue  # not one mirror constant: not two x coordinates of one image
            reversed_ = float(((before[:, a] < before[:, b]) != (after[:, a] < after[:, b])).float().mean())
            ordered = float((validation[:, a] < validation[:, b]).float().mean())
            mixed = float((served[:, a] < served[:, b]).float().mean())
            if reversed_ >= 0.8 and max(ordered, 1 - ordered) >= 0.95 and 0.2 <= mixed <= 0.8:
                # both shares in the validation's own order
                return UnswappedPair(a, b, max(ordered, 1 - ordered), mixed if ordered >= 0.5 else 1 - mixed)
    return None


class CollatedView:
    """``dataset[i]`` as the training loader's own ``collate_fn`` serves it, batch axis dropped:
    an augmentation written in the collate_fn (flip half of each batch) acts on every draw."""

    def __init__(self, dataset: Any, collate: Any) -> None:
        self.dataset, self.collate = dataset, collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        batch = self.collate([self.dataset[index]])
        return map_batch(lambda leaf: leaf[0] if isinstance(leaf, torch.Tensor) and leaf.dim() else leaf, batch)


def served_dataset(loader: Any) -> Any:
    """The training dataset, read through the loader's collate_fn when it is one of the user's."""
    dataset = getattr(loader, "dataset", None)
    collate = getattr(loader, "collate_fn", None)
    if dataset is None or collate is None or collate is default_collate \
            or getattr(collate, "__module__", "").startswith("torch.utils.data"):
        return dataset
    return CollatedView(dataset, collate)


class FlipLabelsCheck(Check):
    """FLIP_CHANGES_CLASS: a random horizontal flip, kept label, two classes that are mirrors;
    FLIP_KEEPS_COORDINATES: a random horizontal flip that leaves a horizontal coordinate;
    FLIP_SIDES_NOT_SWAPPED: one that mirrors a left and a right x without swapping them;
    FLIP_REVERSES_CHANNELS: a random 'flip' that reverses the colour channels instead."""

    name = "data.flip_labels"
    stage = Stage.DATA
    codes = ("FLIP_CHANGES_CLASS", "FLIP_KEEPS_COORDINATES", "FLIP_SIDES_NOT_SWAPPED", "FLIP_REVERSES_CHANNELS")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        dataset = getattr(ctx.train_loader, "dataset", None)
        if dataset is None or not is_map_style(dataset):
            findings.data["summary"] = "no map-style training dataset"
            return
        dataset = served_dataset(ctx.train_loader)
        guard = DataGuard(ctx, self.name, findings)
        with preserved_data_state(ctx):
            size = guard.call(len, dataset, what="len(dataset)")
            sample = guard.call(dataset.__getitem__, 0, what="dataset[0]") if size else None
            first = image_and_label(sample) if size else None
            if first is None:
                if size and image_and_coordinates(sample) is not None:
                    self._coordinates(dataset, size, guard, findings)
                    self._sides(ctx, dataset, size, guard, findings)
                    return
                findings.data["summary"] = "not (image, class) samples"
                return
            reversed_channels: list[int] = []
            flipped = flipped_indices(dataset, size, guard, image_and_label, reversed_channels)
            findings.data["flipped_indices"] = flipped
            if len(reversed_channels) >= MIN_FLIPPED and flipped < MIN_FLIPPED:
                findings.data["summary"] = f"{len(reversed_channels)} indices came back with their channels reversed"
                findings.warning(
                    "FLIP_REVERSES_CHANNELS",
                    f"the training dataset's random augmentation reverses the colour channels: "
                    f"{len(reversed_channels)} of {PROBED_INDICES} indices, each drawn {DRAWS} times, came back as an "
                    "image and the same image with its channel axis reversed (RGB <-> BGR), never as its horizontal "
                    "mirror. A horizontal flip on the wrong axis does this (np.flip(img, axis=-1) or img[..., ::-1] on "
                    "an HWC array, x.flip(0) on a CHW tensor): the training images get swapped colours and no flip at "
                    "all; a channel-shuffle augmentation does it on purpose, and changes the class wherever the colour "
                    "is what the label means",
                    "Flip the width axis: np.flip(img, axis=1) (or np.fliplr) on an HWC array, x.flip(-1) on a CHW "
                    "tensor, or torchvision's RandomHorizontalFlip; drop colour-changing augmentation where the colour "
                    "defines the class.",
                    "data.train",
                )
                return
            if flipped < MIN_FLIPPED:
                findings.data["summary"] = f"{flipped} of {PROBED_INDICES} indices came back mirrored: no random flip"
                return
            samples = served_samples(dataset, size, guard, image_and_label)
            if not samples:
                return
        images, labels = [image for image, _ in samples], [label for _, label in samples]
        found = mirror_classes(torch.stack(images), torch.tensor(labels))
        findings.data["summary"] = (f"random horizontal flip; classes {found.first} and {found.second} are one once "
                                    "mirrored" if found else "random horizontal flip; every class pair separates")
        if found is None:
            return
        findings.warning(
            "FLIP_CHANGES_CLASS",
            f"the training dataset flips images horizontally at random ({flipped} of {PROBED_INDICES} indices came "
            f"back as an image and its mirror under one label), and classes {found.first} and {found.second} cannot "
            f"be told apart as the dataset serves them: a nearest-neighbour vote between them is "
            f"right {found.accuracy:.0%} of the time (chance: 50%), where images' nearest neighbours are meaningful. "
            "The classes differ by left and right (a direction, a "
            "mirrored glyph or sign), and the flip turns one into the other while keeping its label: half their "
            "samples are mislabelled and the model cannot learn the difference",
            "Drop the horizontal flip for these classes (transforms without RandomHorizontalFlip; keep augmentations "
            "that preserve the class), or swap the label with the image when flipping (left <-> right).",
            "data.train",
        )

    @staticmethod
    def _sides(ctx: PreflightContext, dataset: Any, size: int, guard: DataGuard, findings: Findings) -> None:
        if ctx.val_loader is None or "column" in findings.data:
            return
        pairs = mirrored_targets(dataset, size, guard)
        if len(pairs) < MIN_FLIPPED:
            return
        served = served_samples(dataset, size, guard, image_and_coordinates)
        validation = None
        with guard.batches(ctx.val_loader, "the validation targets") as batches:
            batch = next(batches, None)
        if isinstance(batch, (list, tuple)) and len(batch) == 2 and isinstance(batch[1], torch.Tensor) \
                and batch[1].dim() >= 2 and batch[1].is_floating_point():
            validation = batch[1].detach().float().cpu().flatten(1)  # (B, K, 2) keypoints: one column each
        if not served or validation is None:
            return
        found = unswapped_pair(pairs, torch.stack([target for _, target in served]), validation)
        if found is None:
            return
        findings.data["unswapped"] = {"columns": [found.first, found.second], "ordered": round(found.ordered, 3),
                                      "mixed": round(found.mixed, 3)}
        findings.warning(
            "FLIP_SIDES_NOT_SWAPPED",
            f"the training dataset flips images horizontally at random and mirrors the target's x coordinates with "
            f"them, but target columns {found.first} and {found.second} are not swapped: in the validation data "
            f"column {found.first} lies on one side of column {found.second} in {found.ordered:.0%} of the rows (a "
            f"left and a right part: left/right eyes, hands, a box's x_min and x_max), while the training targets "
            f"as served have them in that order only {found.mixed:.0%} of the time. After a flip the 'left' target "
            "points at the part now on the right, so the two contradict each other and the model regresses both "
            "towards the middle",
            "Swap the left/right pairs when flipping, after mirroring x (keypoints[:, [left, right]] = "
            "keypoints[:, [right, left]]; a box's x_min, x_max = W - x_max, W - x_min), or use an augmentation with "
            "flip pairs (albumentations' HorizontalFlip with keypoint labels remapped, mmpose's flip_pairs).",
            "data.train",
        )

    @staticmethod
    def _coordinates(dataset: Any, size: int, guard: DataGuard, findings: Findings) -> None:
        flipped = flipped_indices(dataset, size, guard, image_and_coordinates)
        findings.data["flipped_indices"] = flipped
        if flipped < MIN_FLIPPED:
            findings.data["summary"] = f"{flipped} of {PROBED_INDICES} indices came back mirrored with one target"
            return
        samples = served_samples(dataset, size, guard, image_and_coordinates)
        if samples is None or len(samples) < MIN_CLASS * 4:
            return
        images, targets = [image for image, _ in samples], [target for _, target in samples]
        found = kept_coordinate(torch.stack(images), torch.stack(targets))
        findings.data["summary"] = (f"random horizontal flip; target column {found.column} is a horizontal coordinate "
                                    "it leaves unchanged" if found else "random horizontal flip; no kept coordinate")
        if found is None:
            return
        findings.data.update(column=found.column, tracked=round(found.tracked, 3), signed=round(found.signed, 3))
        findings.warning(
            "FLIP_KEEPS_COORDINATES",
            f"the training dataset flips images horizontally at random ({flipped} of {PROBED_INDICES} indices came "
            f"back as an image and its mirror with the same target), and the flip is applied to the image while the "
            f"target's box or keypoint coordinates are not flipped with it: column {found.column} is a horizontal coordinate the flip does not "
            f"move: its distance from its middle follows the object's distance "
            f"from the image's centre (correlation {found.tracked:.2f}), but its value hardly follows the object's "
            f"position as served ({found.signed:+.2f}). For every flipped image the box, keypoint or centre x still "
            "points at the original side, the mirror of where the object now is, so half the targets are wrong and "
            "the regressor learns to hedge x towards the middle",
            "Flip the annotation with the image in the same branch: x = W - 1 - x for a pixel coordinate (1 - x when "
            "normalised; a box's x_min, x_max = W - x_max, W - x_min), or use an augmentation library that transforms "
            "boxes and keypoints with the image (torchvision.transforms.v2 with tv_tensors.BoundingBoxes, "
            "albumentations with bbox_params).",
            "data.train",
        )
