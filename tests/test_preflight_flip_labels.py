"""FLIP_CHANGES_CLASS: a random horizontal flip that keeps the label on left/right classes; no
flip, a flip that swaps left and right with the image, and a flip on shapes that do not care
stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.flip_labels import FlipLabelsCheck, mirror_classes, shows_mirror
from tests.preflight_support import assert_quiet, codes

LEFT, RIGHT, UP, DOWN = 0, 1, 2, 3


def glyph(kind: int, size: int = 12) -> torch.Tensor:
    """A bar with a block at one end: the block's side is the direction."""
    image = torch.zeros(size, size)
    middle = size // 2
    if kind in (LEFT, RIGHT):
        image[middle - 1 : middle + 1, 2:-2] = 1.0
        end = slice(1, 4) if kind == LEFT else slice(size - 4, size - 1)
        image[middle - 3 : middle + 3, end] = 1.0
    elif kind in (UP, DOWN):
        image[2:-2, middle - 1 : middle + 1] = 1.0
        end = slice(1, 4) if kind == UP else slice(size - 4, size - 1)
        image[end, middle - 3 : middle + 3] = 1.0
    else:  # a ring or a cross: the same under a mirror
        image[2:-2, 2:-2] = 1.0
        if kind == 4:
            image[4:-4, 4:-4] = 0.0
        else:
            image[2:-2, 2:-2] = 0.0
            image[middle - 1 : middle + 1, :] = 1.0
            image[:, middle - 1 : middle + 1] = 1.0
    return image


class Signs(Dataset):
    def __init__(self, kinds: tuple[int, ...], flip: str):
        g = torch.Generator().manual_seed(0)
        self.labels = torch.tensor(kinds)[torch.randint(0, len(kinds), (600,), generator=g)]
        self.noise = 0.15 * torch.randn(600, 12, 12, generator=g)
        self.flip = flip

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        label = int(self.labels[index])
        image = glyph(label) + self.noise[index]
        if self.flip != "none" and torch.rand(1).item() < 0.5:  # RandomHorizontalFlip(p=0.5)
            image = image.flip(-1)
            if self.flip == "swap" and label in (LEFT, RIGHT):
                label = RIGHT if label == LEFT else LEFT
        return image.unsqueeze(0), label


def result(dataset: Dataset):
    model = nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(16, 6))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(dataset, batch_size=32, shuffle=True), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), FlipLabelsCheck()])
    return report.check("data.flip_labels")


def test_a_label_keeping_flip_on_direction_classes_fires():
    found = result(Signs((LEFT, RIGHT, UP, DOWN), flip="keep"))
    assert codes(found) == {"FLIP_CHANGES_CLASS"}
    assert "classes 0 and 1" in found.issues[0].message and "RandomHorizontalFlip" in found.issues[0].fix


@pytest.mark.parametrize("kinds, flip", [((LEFT, RIGHT, UP, DOWN), "none"), ((LEFT, RIGHT, UP, DOWN), "swap"),
                                         ((4, 5, UP, DOWN), "keep")],
                         ids=["no_flip", "flip_swaps_left_and_right", "mirror_symmetric_classes"])
def test_no_flip_a_label_swapping_flip_and_symmetric_classes_are_quiet(kinds, flip):
    assert_quiet(result(Signs(kinds, flip)))


def test_the_pure_parts():
    image = torch.randn(1, 12, 12)
    assert shows_mirror([image, image.clone(), image.flip(-1)])
    assert not shows_mirror([image, image.clone()])
    symmetric = torch.ones(1, 12, 12)
    assert not shows_mirror([symmetric, symmetric.flip(-1)])  # equal: nothing to tell
    g = torch.Generator().manual_seed(3)
    arrow = glyph(LEFT).unsqueeze(0)
    def noisy(x):  # sensor noise added after the flip: never an exact mirror
        return x + 0.1 * torch.randn(x.shape, generator=g)
    assert shows_mirror([noisy(arrow), noisy(arrow), noisy(arrow.flip(-1))])
    assert not shows_mirror([noisy(arrow), noisy(arrow), noisy(arrow)])
    assert not shows_mirror([noisy(symmetric), noisy(symmetric.flip(-1))])
    images = torch.stack([glyph(k).unsqueeze(0) for k in (LEFT, RIGHT, UP, DOWN) for _ in range(30)])
    images = images + 0.1 * torch.randn(images.shape, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([k for k in (LEFT, RIGHT, UP, DOWN) for _ in range(30)])
    flipped = torch.rand(120, generator=torch.Generator().manual_seed(2)) < 0.5
    images[flipped] = images[flipped].flip(-1)
    found = mirror_classes(images, labels)
    assert found is not None and (found.first, found.second) == (LEFT, RIGHT) and found.accuracy <= 0.7


class PlacedSigns(Signs):
    """The glyphs at random places in a larger frame: pixels no longer compare shapes, the
    shift-invariant features do."""

    def __init__(self, flip: str):
        super().__init__((LEFT, RIGHT, UP, DOWN), flip)
        g = torch.Generator().manual_seed(3)
        self.offsets = torch.randint(0, 12, (600, 2), generator=g)

    def __getitem__(self, index: int):
        label = int(self.labels[index])
        frame = 0.15 * torch.randn(1, 24, 24, generator=torch.Generator().manual_seed(index))
        r, c = self.offsets[index].tolist()
        frame[0, r : r + 12, c : c + 12] += glyph(label)
        if self.flip == "keep" and torch.rand(1).item() < 0.5:  # the whole image, as RandomHorizontalFlip does
            frame = frame.flip(-1)
        return frame, label


@pytest.mark.parametrize("flip", ["keep", "none"])
def test_glyphs_anywhere_in_the_frame_are_compared_by_shape(flip):
    found = result(PlacedSigns(flip))
    assert codes(found) == ({"FLIP_CHANGES_CLASS"} if flip == "keep" else set())


# ---------------------------------------------------------------- FLIP_KEEPS_COORDINATES

SIDE = 24


class Spots(Dataset):
    """A bright 5x5 spot on a noisy background; the target is its (x, y) centre in [0, 1].
    ``flip``: None (no augmentation), "image" (the image only, the bug) or "both"."""

    def __init__(self, flip, rows: int = 400):
        g = torch.Generator().manual_seed(0)
        self.images = 0.2 * torch.rand(rows, 1, SIDE, SIDE, generator=g)
        self.centres = torch.randint(2, SIDE - 2, (rows, 2), generator=g)
        for image, (x, y) in zip(self.images, self.centres.tolist(), strict=True):
            image[0, y - 2:y + 3, x - 2:x + 3] += 0.8
        self.flip = flip

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image, (x, y) = self.images[index], self.centres[index].tolist()
        if self.flip and torch.rand(()) < 0.5:
            image = image.flip(-1)
            if self.flip == "both":
                x = SIDE - 1 - x
        return image, torch.tensor([x, y], dtype=torch.float32) / SIDE


def spot_report(flip):
    model = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Spots(flip), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), FlipLabelsCheck()])
    return report.check("data.flip_labels")


def test_a_flip_that_leaves_the_x_coordinate_fires():
    result = spot_report("image")
    issues = [i for i in result.issues if i.code == "FLIP_KEEPS_COORDINATES"]
    assert len(issues) == 1 and result.data["column"] == 0
    assert "W - 1 - x" in issues[0].fix and "column 0 is a horizontal coordinate" in issues[0].message
    assert "coordinates are not flipped with it" in issues[0].message


@pytest.mark.parametrize("flip", [None, "both"])
def test_no_flip_or_a_flip_that_moves_the_coordinate_too_is_quiet(flip):
    assert_quiet(spot_report(flip))


class Brightness(Spots):
    """The same flipped spots, regressed to how bright the image is: nothing the flip moves."""

    def __getitem__(self, index):
        image, _ = super().__getitem__(index)
        return image, image.mean().reshape(1) * torch.ones(2)


def test_a_flip_on_targets_that_are_no_positions_is_quiet():
    model = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Brightness("image"), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), FlipLabelsCheck()])
    assert_quiet(report.check("data.flip_labels"))


class Hands(Dataset):
    """A left spot (x in 2..6) and a right spot (x in 9..13); the target (left x, left y, right x,
    right y) / SIDE. ``flip``: "mirror" (x mirrored, the pair not swapped: the bug), "swap" (mirrored
    and swapped), None; ``unordered``: the two parts have no side (the first may be either)."""

    def __init__(self, flip, rows: int = 400, unordered: bool = False, augment: bool = True):
        g = torch.Generator().manual_seed(1)
        left = torch.stack([2 + torch.randint(0, 5, (rows,), generator=g), torch.randint(3, 13, (rows,), generator=g)], 1)
        right = torch.stack([9 + torch.randint(0, 5, (rows,), generator=g), torch.randint(3, 13, (rows,), generator=g)], 1)
        if unordered:
            swap = torch.rand(rows, generator=g) < 0.5
            left, right = torch.where(swap[:, None], right, left), torch.where(swap[:, None], left, right)
        self.points = torch.cat([left, right], 1)
        self.images = 0.2 * torch.rand(rows, 1, SIDE, SIDE, generator=g)
        for image, (lx, ly, rx, ry) in zip(self.images, self.points.tolist(), strict=True):
            image[0, ly - 1:ly + 2, lx - 1:lx + 2] += 0.8
            image[0, ry - 1:ry + 2, rx - 1:rx + 2] += 0.5
        self.flip, self.augment = flip, augment

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image, (lx, ly, rx, ry) = self.images[index], self.points[index].tolist()
        if self.augment and self.flip and torch.rand(()) < 0.5:
            image = image.flip(-1)
            lx, rx = SIDE - 1 - lx, SIDE - 1 - rx
            if self.flip == "swap":
                (lx, ly), (rx, ry) = (rx, ry), (lx, ly)
        return image, torch.tensor([lx, ly, rx, ry], dtype=torch.float32) / SIDE


@pytest.mark.parametrize("flip, unordered, fires", [("mirror", False, True), ("swap", False, False),
                                                    (None, False, False), ("mirror", True, False)],
                         ids=["mirrored_not_swapped", "swapped", "no_flip", "parts_without_a_side"])
def test_a_flip_that_mirrors_left_and_right_parts_without_swapping_them(flip, unordered, fires):
    model = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Hands(flip, unordered=unordered), batch_size=32, shuffle=True),
                           val_loader=DataLoader(Hands(flip, unordered=unordered, augment=False), batch_size=100),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FlipLabelsCheck()])
    issues = [i for i in report.check("data.flip_labels").issues if i.code == "FLIP_SIDES_NOT_SWAPPED"]
    assert bool(issues) == fires
    if issues:
        assert "columns 0 and 2 are not swapped" in issues[0].message and "keypoints[:, [left, right]]" in issues[0].fix


class ColourPhotos(Dataset):
    """uint8-style HWC arrays with a hand-written random horizontal flip, then HWC -> CHW."""

    def __init__(self, axis: int):
        g = torch.Generator().manual_seed(5)
        self.images = torch.rand(300, 12, 12, 3, generator=g)
        self.labels = torch.randint(0, 3, (300,), generator=g)
        self.axis = axis

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index].numpy()
        if torch.rand(1).item() < 0.5:
            import numpy as np
            image = np.flip(image, axis=self.axis).copy()
        return torch.from_numpy(image).permute(2, 0, 1).contiguous(), int(self.labels[index])


@pytest.mark.parametrize("axis", [-1, 1], ids=["channel_axis", "width_axis"])
def test_a_flip_on_the_channel_axis_of_hwc_images(axis):
    found = result(ColourPhotos(axis))
    if axis == 1:
        assert "FLIP_REVERSES_CHANNELS" not in codes(found)
        return
    assert codes(found) == {"FLIP_REVERSES_CHANNELS"}
    assert "RGB <-> BGR" in found.issues[0].message and "np.flip(img, axis=1)" in found.issues[0].fix


def flipping_collate(swap: bool):
    """Batch-level augmentation in the collate_fn: flip half the batch, mirror the x of the (K, 2)
    landmarks, and (``swap``) exchange the left and right landmark."""
    def collate(items):
        images = torch.stack([image for image, _ in items])
        points = torch.stack([target for _, target in items]).view(len(items), 2, 2)
        flip = torch.rand(len(items)) < 0.5
        images[flip] = images[flip].flip(-1)
        points[flip, :, 0] = (SIDE - 1) / SIDE - points[flip, :, 0]
        if swap:
            points[flip] = points[flip][:, [1, 0]]
        return images, points
    return collate


@pytest.mark.parametrize("swap", [False, True], ids=["mirrored_not_swapped", "swapped"])
def test_a_flip_in_the_collate_fn_is_read_through_it(swap):
    model = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 4), nn.Unflatten(1, (2, 2)))
    unflipped = lambda items: (torch.stack([i for i, _ in items]), torch.stack([t for _, t in items]).view(-1, 2, 2))  # noqa: E731
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Hands(None), batch_size=32, shuffle=True, collate_fn=flipping_collate(swap)),
                           val_loader=DataLoader(Hands(None, augment=False), batch_size=100, collate_fn=unflipped),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), FlipLabelsCheck()])
    issues = [i for i in report.check("data.flip_labels").issues if i.code == "FLIP_SIDES_NOT_SWAPPED"]
    assert bool(issues) == (not swap), report.check("data.flip_labels").data
