"""data.mask_alignment: segmentation masks that lie on their images only once transposed or
flipped (an NHWC image made channels-first with transpose(1, 3); a flip of the image alone);
aligned masks, and masks that do not show in the intensities, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.mask_alignment import MaskAlignmentCheck, misplaced


def road_markings(n: int = 128, size: int = 16, visible: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """NHWC images with horizontal markings, brighter in red where visible, and (H, W) masks."""
    g = torch.Generator().manual_seed(0)
    images = 0.15 * torch.rand(n, size, size, 3, generator=g)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        r, c = int(torch.randint(0, size - 2, (1,), generator=g)), int(torch.randint(0, size - 7, (1,), generator=g))
        masks[i, r:r + 2, c:c + 7] = 1
        if visible:
            images[i, r:r + 2, c:c + 7, 0] += 0.8
    return images, masks


def collate(to_channels_first, flip_image_only: bool = False):
    def collate_fn(rows):
        images = to_channels_first(torch.stack([row[0] for row in rows]))
        if flip_image_only:
            flip = torch.rand(len(rows), generator=torch.Generator().manual_seed(1)) < 0.5
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
        return images, torch.stack([row[1] for row in rows])
    return collate_fn


def alarms(collate_fn, visible: bool = True) -> list:
    torch.manual_seed(0)  # the shuffled batch and the model: the same whatever ran before in this process
    images, masks = road_markings(visible=visible)
    model = nn.Conv2d(3, 2, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(images, masks), batch_size=32, shuffle=True, collate_fn=collate_fn),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    return [i for i in report.check("data.mask_alignment").issues if i.code == "MASK_MISALIGNED"]


def test_images_transposed_to_channels_first_while_masks_are_not_are_misaligned():
    issues = alarms(collate(lambda x: x.transpose(1, 3)))
    assert issues and "transposed" in issues[0].message and "permute(0, 3, 1, 2)" in issues[0].fix


def test_a_random_flip_of_the_image_alone_is_found_in_the_flipped_samples():
    issues = alarms(collate(lambda x: x.permute(0, 3, 1, 2), flip_image_only=True))
    assert issues and "flipped left-right" in issues[0].message and "random augmentation" in issues[0].message


@pytest.mark.parametrize("visible", [True, False], ids=["aligned", "invisible_in_pixels"])
def test_aligned_masks_are_quiet(visible):
    assert not alarms(collate(lambda x: x.permute(0, 3, 1, 2)), visible=visible)


def test_symmetric_blobs_say_nothing():
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    disc = ((yy - 7.5) ** 2 + (xx - 7.5) ** 2 < 16).long()
    images = disc.float()[None, None].repeat(16, 3, 1, 1) + 0.05 * torch.randn(16, 3, 16, 16)
    assert misplaced(images, disc[None].repeat(16, 1, 1)) is None


class CroppedScans(torch.utils.data.Dataset):
    """24x24 scans with a bright lesion, random 16x16 crops of the scan and its mask."""

    def __init__(self, joint: bool):
        g = torch.Generator().manual_seed(3)
        self.masks = torch.zeros(96, 24, 24, dtype=torch.long)
        for i in range(96):
            top, left = torch.randint(4, 14, (2,), generator=g).tolist()
            self.masks[i, top:top + 6, left:left + 6] = 1
        self.scans = self.masks[:, None].float() + 0.2 * torch.randn(96, 1, 24, 24, generator=g)
        self.joint, self.g = joint, torch.Generator().manual_seed(4)

    def __len__(self):
        return 96

    def crop(self):
        return torch.randint(0, 9, (2,), generator=self.g).tolist()

    def __getitem__(self, i):
        i0, j0 = self.crop()
        i1, j1 = (i0, j0) if self.joint else self.crop()
        return self.scans[i, :, i0:i0 + 16, j0:j0 + 16], self.masks[i, i1:i1 + 16, j1:j1 + 16]


@pytest.mark.parametrize("joint", [False, True])
def test_image_and_mask_cropped_at_different_places(joint):
    model = nn.Conv2d(1, 2, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(CroppedScans(joint), batch_size=32), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    issues = report.check("data.mask_alignment").issues
    if joint:
        assert not issues
    else:
        assert len(issues) == 1 and "cropped at different places" in issues[0].message
        assert "apply it to both" in issues[0].fix


@pytest.mark.parametrize("joint", [False, True], ids=["separate_coin_tosses", "one_toss"])
def test_binary_float_masks_for_bce_flipped_on_their_own_coin(joint):
    """(B, 1, H, W) 0/1 float masks, as BCEWithLogitsLoss takes them."""
    torch.manual_seed(0)
    images, masks = road_markings()
    images, masks = images.permute(0, 3, 1, 2), masks[:, None].float()

    def separately(rows):
        out_images, out_masks = [], []
        for image, mask in rows:
            flip_image = bool(torch.rand(1) < 0.5)
            flip_mask = flip_image if joint else bool(torch.rand(1) < 0.5)
            out_images.append(image.flip(-1) if flip_image else image)
            out_masks.append(mask.flip(-1) if flip_mask else mask)
        return torch.stack(out_images), torch.stack(out_masks)

    model = nn.Conv2d(3, 1, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(images, masks), batch_size=32, shuffle=True, collate_fn=separately),
                           loss_fn=nn.BCEWithLogitsLoss(), checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    issues = [i for i in report.check("data.mask_alignment").issues if i.code == "MASK_MISALIGNED"]
    assert bool(issues) == (not joint)
    if issues:
        assert "flipped or rotated independently" in issues[0].message


def landmark_plates(n: int = 64, size: int = 16, indexing: str = "xy") -> TensorDataset:
    """Plates with a bright bolt head and a dark nut, and one Gaussian heatmap per landmark drawn
    on np.meshgrid-style grids: 'xy' puts each peak on its landmark, 'ij' read as (x, y) transposes it."""
    g = torch.Generator().manual_seed(0)
    images = 0.5 + 0.04 * torch.randn(n, 1, size, size, generator=g)
    maps = torch.zeros(n, 2, size, size)
    first, second = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(),
                                   indexing=indexing)
    for i in range(n):
        for k, value in enumerate((0.95, 0.1)):
            cx, cy = (int(v) for v in torch.randint(2, size - 2, (2,), generator=g))
            images[i, 0, cy - 1:cy + 2, cx - 1:cx + 2] = value
            maps[i, k] = torch.exp(-((first - cx) ** 2 + (second - cy) ** 2) / (2 * 1.2 ** 2))
    return TensorDataset(images, maps)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_keypoint_heatmaps_drawn_on_ij_grids_read_as_xy_are_transposed(indexing):
    torch.manual_seed(0)
    model = nn.Conv2d(1, 2, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(landmark_plates(indexing=indexing), batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    found = [i for i in report.check("data.mask_alignment").issues if i.code == "MASK_MISALIGNED"]
    if indexing == "ij":
        assert len(found) == 1 and "transposed" in found[0].message and "meshgrid" in found[0].fix
    else:
        assert not found


def test_an_image_to_image_target_lies_on_its_image_and_stays_quiet():
    g = torch.Generator().manual_seed(3)
    clean = torch.rand(64, 1, 16, 16, generator=g).clamp(0.05, 0.95)
    noisy = clean + 0.1 * torch.randn(64, 1, 16, 16, generator=g)
    model = nn.Conv2d(1, 1, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(noisy, clean), batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    assert not [i for i in report.check("data.mask_alignment").issues if i.code == "MASK_MISALIGNED"]


class TranslatedPlates(torch.utils.data.Dataset):
    """Plates with one bright bolt head, its keypoint and its heatmap, translated by 0-4 pixels
    right and down; the keypoints ride along in the batch, as keypoint datasets return them."""

    def __init__(self, move_heatmap: bool):
        self.plates = landmark_plates()
        self.move_heatmap = move_heatmap
        self.g = torch.Generator().manual_seed(5)

    def __len__(self):
        return len(self.plates)

    def __getitem__(self, i):
        image, maps = self.plates[i]
        dy, dx = torch.randint(0, 5, (2,), generator=self.g).tolist()
        keypoint = torch.tensor([dx, dy])
        image = torch.roll(image, (dy, dx), (1, 2))
        return image, keypoint, torch.roll(maps, (dy, dx), (1, 2)) if self.move_heatmap else maps


@pytest.mark.parametrize("move_heatmap", [False, True], ids=["image_only", "both"])
def test_a_translation_of_the_image_alone_leaves_the_heatmap_peaks_off_their_keypoints(move_heatmap):
    torch.manual_seed(0)
    model = nn.Conv2d(1, 2, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TranslatedPlates(move_heatmap), batch_size=32, shuffle=True),
                           loss_fn=lambda m, batch: nn.functional.mse_loss(m(batch[0]), batch[2]),
                           checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    found = [i for i in report.check("data.mask_alignment").issues if i.code == "MASK_MISALIGNED"]
    if move_heatmap:
        assert not found
    else:
        assert len(found) == 1 and "not to the target heatmap" in found[0].message
        assert "torch.roll(heatmap" in found[0].fix


class LesionVolumes(torch.utils.data.Dataset):
    """(1, 12, 12, 12) noisy scans with a brighter box lesion off the diagonals, and (12, 12, 12)
    label volumes; ``labels``: 'aligned', 'xyz' (from a reader with the axes reversed) or
    'flip_image_only' (a random flip of the scan alone, its own coin per item)."""

    def __init__(self, labels: str):
        g = torch.Generator().manual_seed(0)
        self.labels, self.scans, self.masks = labels, [], []
        for _ in range(96):
            mask = torch.zeros(12, 12, 12, dtype=torch.long)
            z, y, x = (int(v) for v in torch.randint(1, 7, (3,), generator=g))
            mask[z:z + 2, y:y + 4, x:x + 5] = 1
            self.scans.append(0.5 * torch.randn(1, 12, 12, 12, generator=g) + mask.float())
            self.masks.append(mask)
        self.coins = torch.rand(96, generator=torch.Generator().manual_seed(1)) < 0.5

    def __len__(self) -> int:
        return len(self.masks)

    def __getitem__(self, i):
        scan, mask = self.scans[i], self.masks[i]
        if self.labels == "xyz":
            mask = mask.permute(2, 1, 0)
        if self.labels == "flip_image_only" and self.coins[i]:
            scan = scan.flip(-1)
        return scan, mask


@pytest.mark.parametrize("labels, named", [("aligned", None), ("xyz", "axes reversed"),
                                           ("flip_image_only", "flipped along the width axis")])
def test_label_volumes_from_another_reader_or_left_unflipped(labels, named):
    torch.manual_seed(0)
    model = nn.Conv3d(1, 2, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(LesionVolumes(labels), batch_size=4, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), MaskAlignmentCheck()])
    found = [i for i in report.check("data.mask_alignment").issues if i.code == "MASK_MISALIGNED"]
    assert bool(found) == (named is not None), report.check("data.mask_alignment").data
    if named:
        assert named in found[0].message
        if labels == "xyz":
            assert "SimpleITK" in found[0].message and "permute(0, 3, 2, 1)" in found[0].fix
