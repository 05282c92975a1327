"""MASK_INTERPOLATED: class-id masks downsampled bilinearly and truncated; nearest-neighbour
resizing, a boundary class of its own (background, boundary, interior) and clean masks where
many classes meet stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.mask_interpolation import MaskInterpolationCheck, interpolation_rims
from tests.preflight_support import assert_quiet, codes


def scenes(samples: int = 64, size: int = 48) -> torch.Tensor:
    """Rectangles of classes 1-3 on background 0."""
    g = torch.Generator().manual_seed(0)
    masks = torch.zeros(samples, size, size, dtype=torch.long)
    for mask in masks:
        for _ in range(3):
            k, (h, w) = int(torch.randint(1, 4, (1,), generator=g)), torch.randint(8, 20, (2,), generator=g).tolist()
            r, c = int(torch.randint(0, size - h, (1,), generator=g)), int(torch.randint(0, size - w, (1,), generator=g))
            mask[r : r + h, c : c + w] = k
    return masks


def resized(masks: torch.Tensor, mode: str) -> torch.Tensor:
    kwargs = {"align_corners": False} if mode == "bilinear" else {}
    return F.interpolate(masks[:, None].float(), size=24, mode=mode, **kwargs)[:, 0].long()


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_masks_resized_bilinearly_fire_and_nearest_is_quiet(mode):
    masks = resized(scenes(), mode)
    images = torch.randn(len(masks), 3, 24, 24, generator=torch.Generator().manual_seed(1))
    model = nn.Conv2d(3, 4, 1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(images, masks), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), MaskInterpolationCheck()])
    result = report.check("data.mask_interpolation")
    if mode == "nearest":
        assert_quiet(result)
    else:
        assert codes(result) == {"MASK_INTERPOLATED"} and "mode='nearest'" in result.issues[0].fix


def test_a_boundary_class_of_its_own_is_quiet():
    masks = torch.zeros(16, 32, 32, dtype=torch.long)
    masks[:, 8:24, 8:24] = 1  # the cell's boundary ring ...
    masks[:, 9:23, 9:23] = 2  # ... around its interior (ids 0 background, 1 boundary, 2 interior)
    assert interpolation_rims(masks) is None


def test_clean_masks_where_many_classes_meet_are_quiet():
    g = torch.Generator().manual_seed(2)
    seeds = torch.randint(0, 40, (8, 12, 2), generator=g).float()
    grid = torch.stack(torch.meshgrid(torch.arange(40.0), torch.arange(40.0), indexing="ij"), -1).reshape(-1, 2)
    masks = torch.stack([torch.cdist(grid, s).argmin(1).reshape(40, 40) % 6 for s in seeds])  # Voronoi cells
    assert interpolation_rims(masks) is None
    assert interpolation_rims(resized(scenes(), "bilinear")) is not None


def test_a_class_bordering_a_void_band_is_not_a_rim():
    # kelp (1) drawn inside an unscored band (255) on background (0): where the band is cut
    # thin, class 1 lies one pixel wide between 0 and 255, by design and not by an average
    masks = torch.zeros(4, 32, 32, dtype=torch.long)
    masks[:, 4:12, 4:12] = 1  # a whole object of class 1
    masks[:, :, 20:] = 255  # the void band
    masks[:, :, 19] = 1  # a thin strip of kelp between background and void
    assert interpolation_rims(masks) is None
    three_classes = resized(scenes(), "bilinear")
    three_classes[:, :, :1] = 255  # a void border does not hide real interpolation rims
    assert interpolation_rims(three_classes) is not None


def small_objects(n: int, seed: int) -> torch.Tensor:
    """32x32 class-id masks (0, 1, 2) of objects 2-5 pixels wide: none keeps an interior at 16x16."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(n, 32, 32, dtype=torch.long)
    for i in range(n):
        for _ in range(6):
            c = int(torch.randint(1, 3, (1,), generator=g))
            h, w = torch.randint(2, 6, (2,), generator=g).tolist()
            top, left = int(torch.randint(0, 32 - h, (1,), generator=g)), int(torch.randint(0, 32 - w, (1,), generator=g))
            masks[i, top:top + h, left:left + w] = c
    return masks


def halved(masks: torch.Tensor, mode: str) -> torch.Tensor:
    kwargs = {"align_corners": False} if mode == "bilinear" else {}
    return F.interpolate(masks[:, None].float(), size=(16, 16), mode=mode, **kwargs)[:, 0].long()


@pytest.mark.parametrize("train_mode", ["bilinear", "nearest"])
def test_small_objects_resized_bilinear_in_training_only(train_mode):
    from optimus_preflight.preflight.checks.mask_interpolation import MaskInterpolationCheck

    train_masks, val_masks = halved(small_objects(128, 0), train_mode), halved(small_objects(64, 1), "nearest")
    g = torch.Generator().manual_seed(2)
    model = nn.Conv2d(3, 3, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(torch.randn(128, 3, 16, 16, generator=g), train_masks), batch_size=32),
                           val_loader=DataLoader(TensorDataset(torch.randn(64, 3, 16, 16, generator=g), val_masks),
                                                 batch_size=32),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), MaskInterpolationCheck()])
    found = [i for i in report.check("data.mask_interpolation").issues if i.code == "MASK_INTERPOLATED"]
    if train_mode == "bilinear":
        assert len(found) == 1 and "validation masks" in found[0].message and "mode='nearest'" in found[0].fix
    else:
        assert not found


def test_level_bands_of_a_smooth_field_are_quiet_and_the_same_bands_resized_bilinearly_fire():
    """Classes cut from one smooth field at two levels (elevation or intensity bands): class 1
    runs between 0 and 2 everywhere and narrows to one pixel where the field is steep, but each
    narrow stretch is joined to a wide one. Objects resized bilinearly still fire: their rims are
    rings of their own."""
    g = torch.Generator().manual_seed(3)
    field = F.avg_pool2d(torch.randn(64, 1, 22, 22, generator=g), 7, stride=1)
    field = (field - field.mean()) / field.std()
    bands = torch.bucketize(field[:, 0], torch.tensor([-0.45, 0.45]))
    assert interpolation_rims(bands) is None
    assert interpolation_rims(resized(scenes(), "bilinear")) is not None


def squares_and_discs(n: int, seed: int) -> torch.Tensor:
    """64x64 masks: a large square of class 1 and small discs of class 2 on background 0."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij")
    masks = torch.zeros(n, 64, 64, dtype=torch.long)
    for mask in masks:
        side = int(torch.randint(14, 21, (1,), generator=g))
        top, left = torch.randint(0, 64 - side, (2,), generator=g).tolist()
        mask[top:top + side, left:left + side] = 1
        for _ in range(4):
            r, c = torch.randint(6, 58, (2,), generator=g).tolist()
            radius = int(torch.randint(3, 6, (1,), generator=g))
            mask[(rows - r) ** 2 + (cols - c) ** 2 <= radius ** 2] = 2
    return masks


@pytest.mark.parametrize("train_mode", ["bilinear", "nearest"])
def test_rims_around_small_discs_beside_large_objects_of_the_rim_class(train_mode):
    # Rounded bilinear downscaling rings every disc (2) with class 1 where it meets background (0):
    # too few rim pixels beside the large squares of class 1 for the one-batch rule, plain beside validation's.
    def down(masks, mode):
        kwargs = {"align_corners": False} if mode == "bilinear" else {}
        return F.interpolate(masks[:, None].float(), size=(32, 32), mode=mode, **kwargs)[:, 0].round().long()

    train_masks, val_masks = down(squares_and_discs(96, 0), train_mode), down(squares_and_discs(64, 1), "nearest")
    g = torch.Generator().manual_seed(2)
    model = nn.Conv2d(3, 3, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(torch.randn(96, 3, 32, 32, generator=g), train_masks), batch_size=16),
                           val_loader=DataLoader(TensorDataset(torch.randn(64, 3, 32, 32, generator=g), val_masks),
                                                 batch_size=32),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), MaskInterpolationCheck()])
    found = [i for i in report.check("data.mask_interpolation").issues if i.code == "MASK_INTERPOLATED"]
    assert bool(found) == (train_mode == "bilinear"), found
