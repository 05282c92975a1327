"""Dense targets that do not lie on their images (``data.mask_alignment``).

A segmentation batch pairs ``(B, C, H, W)`` images with ``(B, H, W)`` masks. An image made
channels-first with ``transpose(1, 3)`` is ``(B, C, W, H)``: for square images every shape
matches and each pixel is scored against the mask at the transposed position. A random
flip or rotation applied to the image and not to its mask does the same to some samples.
Keypoint heatmaps ``(B, K, H, W)`` in [0, 1] are read the same way: Gaussians drawn on
``np.meshgrid(..., indexing='ij')`` grids with a formula that takes the first grid for x peak
at each landmark's mirror across the diagonal.

The evidence is in the pixels: where a class is, the image usually differs (a marking is
brighter, a lesion darker). Per sample, the strongest correlation between one image
channel and one class's indicator is measured for the mask as given and for the mask
transposed, flipped and rotated. When a transformed mask lies on the image far better than
the mask as given, in a good share of the samples, the two are misaligned. Masks that do
not show in the intensities correlate weakly every way and say nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_SAMPLES = 64
MAX_CLASSES = 32
MAX_CHANNELS = 16
STRONG = 0.4  # correlation of the transformed mask with the image
BETTER = 2.0  # ... at least this many times the mask as given, plus MARGIN
MARGIN = 0.1
MIN_SHARE = 0.25  # of the samples where some placement of the mask correlates
# A volume's thousands of voxels make a weaker correlation as telling (chance is ~1/sqrt(voxels)),
# and a mirrored label volume still overlaps its structure: a clear gain, as for a shifted mask.
STRONG_VOLUME, VOLUME_GAIN, VOLUME_RATIO = 0.2, 0.1, 1.3
VOLUME_SAMPLES, VOLUME_BUDGET_S = 32, 2.0  # volumes read past a first batch of a few
VOLUME_VOXELS = 16 * 2**20  # ... holding this many label voxels at most (128^3 patches: 8 of them)
MIN_SAMPLES = 4

TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "transposed (height and width swapped)": lambda m: m.transpose(-1, -2),
    "flipped left-right": lambda m: m.flip(-1),
    "flipped upside down": lambda m: m.flip(-2),
    "rotated by 180 degrees": lambda m: m.flip(-1, -2),
}


# A volume (B, C, D, H, W) beside its label volume (B, D, H, W): the same mistakes, one axis more,
# and one more of its own: arrays from two readers whose axis orders differ (ITK / SimpleITK give
# (z, y, x), nibabel's get_fdata() (x, y, z)), which a cubic patch lets through every shape check.
VOLUME_TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "with its axes reversed ((x, y, z) read as (z, y, x))": lambda m: m.permute(*range(m.dim() - 3), -1, -2, -3),
    "with depth and height swapped": lambda m: m.transpose(-3, -2),
    "with height and width swapped": lambda m: m.transpose(-2, -1),
    "flipped along the width axis": lambda m: m.flip(-1),
    "flipped along the height axis": lambda m: m.flip(-2),
    "flipped along the depth axis": lambda m: m.flip(-3),
}
AXES_REVERSED = next(iter(VOLUME_TRANSFORMS))


def transforms_for(spatial: tuple[int, ...]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The placements a mask of these spatial sizes can be tried in: a permutation of its axes only
    where the sizes it swaps are equal."""
    if len(spatial) == 3:
        depth, height, width = spatial
        equal = {AXES_REVERSED: depth == width, "with depth and height swapped": depth == height,
                 "with height and width swapped": height == width}
        return {name: transform for name, transform in VOLUME_TRANSFORMS.items() if equal.get(name, True)}
    return {name: transform for name, transform in TRANSFORMS.items()
            if spatial[-1] == spatial[-2] or not name.startswith("transposed")}


def is_volume(masks: torch.Tensor) -> bool:
    """(B, D, H, W) class ids: label volumes; float (B, K, H, W) maps are 2-D heatmaps."""
    return masks.dim() == 4 and not masks.is_floating_point()


def volume_and_mask(batch: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(volumes (B, C, D, H, W), label volumes (B, D, H, W) as class ids) of a 3-D segmentation batch."""
    found = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)]
    volumes = [leaf for leaf in found if leaf.dim() == 5 and leaf.is_floating_point() and leaf.shape[1] <= MAX_CHANNELS]
    masks = [leaf.reshape(leaf.shape[0], *leaf.shape[-3:]) for leaf in found
             if not leaf.is_floating_point() and (leaf.dim() == 4 or (leaf.dim() == 5 and leaf.shape[1] == 1))]
    if len(volumes) != 1 or len(masks) != 1:
        return None
    volume, mask = volumes[0], masks[0]
    if volume.shape[0] != mask.shape[0] or volume.shape[2:] != mask.shape[1:] or min(mask.shape[1:]) < 2:
        return None
    return volume.detach().float().cpu(), mask.long().cpu()


def image_and_mask(batch: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(images (B, C, H, W), masks (B, H, W) as class ids) of a segmentation batch; volumes
    (B, C, D, H, W) with (B, D, H, W) label volumes likewise."""
    found = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)]
    if any(leaf.dim() == 5 for leaf in found):
        return volume_and_mask(batch)
    shaped = [leaf for leaf in found if leaf.dim() in (3, 4) and leaf.shape[-1] > 1 and (leaf.dim() == 3 or leaf.shape[1] == 1)]
    masks = [leaf for leaf in shaped if not leaf.is_floating_point()]
    if not masks:  # a binary mask as floats, for BCE: 0/1 values only
        masks = [leaf for leaf in shaped if leaf.is_floating_point() and bool(((leaf == 0) | (leaf == 1)).all())]
    images = [leaf for leaf in found if leaf.dim() == 4 and leaf.is_floating_point() and not any(leaf is m for m in masks)]
    if len(masks) != 1 or not images:
        return heatmap_pair(batch)
    mask = masks[0].reshape(masks[0].shape[0], *masks[0].shape[-2:]).long()
    spatial = tuple(mask.shape[-2:])
    for image in images:
        if image.shape[0] != mask.shape[0]:
            continue
        nchw = tuple(image.shape[2:]) == spatial and image.shape[1] <= MAX_CHANNELS
        nhwc = tuple(image.shape[1:3]) == spatial and image.shape[3] <= MAX_CHANNELS
        if nchw and not nhwc:
            return image.detach().float().cpu(), mask.cpu()
        if nhwc and not nchw:
            return image.detach().float().permute(0, 3, 1, 2).cpu(), mask.cpu()
    return None


def heatmap_pair(batch: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(images (B, C, H, W), heatmaps (B, K, H, W)) of an ``(images, heatmaps)`` batch whose
    targets are soft maps in [0, 1] on the images' grid (keypoint heatmaps, soft masks)."""
    if not isinstance(batch, (list, tuple)):
        return None
    # other fields (the keypoints the maps were drawn from, ids) may ride along; the two
    # image-shaped float tensors are the input and its maps, input first as datasets return them
    grids = [t for t in batch if isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_floating_point()]
    if len(grids) != 2 or (len(batch) != 2 and any(isinstance(t, torch.Tensor) and t.dim() >= 3 and not
                                                   any(t is g for g in grids) for t in batch)):
        return None
    image, maps = grids
    if image.shape[0] != maps.shape[0] or image.shape[2:] != maps.shape[2:] or image.shape[1] > MAX_CHANNELS \
            or maps.shape[1] > MAX_CLASSES or image.shape[-1] < 2:
        return None
    maps = maps.detach().float().cpu()
    if float(maps.min()) < 0 or float(maps.max()) > 1 or bool(((maps == 0) | (maps == 1)).all()):
        return None
    return image.detach().float().cpu(), maps


def image_target_pair(batch: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(inputs, targets) of an image-to-image ``(inputs, targets)`` batch (a denoiser, a
    restoration model): two float ``(B, C, H, W)`` (or ``(B, H, W)``) tensors of one shape."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 2:
        return None
    inputs, targets = batch
    if not all(isinstance(t, torch.Tensor) and t.dim() in (3, 4) and t.is_floating_point() for t in (inputs, targets)):
        return None
    if inputs.shape != targets.shape or min(inputs.shape[-2:]) < 8:
        return None
    if inputs.dim() == 3:
        inputs, targets = inputs[:, None], targets[:, None]
    if inputs.shape[1] > MAX_CHANNELS:
        return None
    return inputs.detach().float().cpu(), targets.detach().float().cpu()


CLOSER = 0.5  # a transformed target's squared distance to the input, against the target as given


def mirrored_targets(inputs: torch.Tensor, targets: torch.Tensor) -> tuple[str, int, int] | None:
    """(how the target lies closer, in how many samples, of how many) when, in a good share of
    the samples, a flipped or rotated target is far closer to its input (half the squared
    distance or less) than the target as given (pure). A denoiser's input is its target plus
    noise: the right placement leaves the noise alone, a mirrored one the image's own detail too."""
    wins = {name: 0 for name in TRANSFORMS if not name.startswith("transposed")}
    scored = 0
    for image, target in zip(inputs[:MAX_SAMPLES], targets[:MAX_SAMPLES], strict=True):
        given = float((image - target).pow(2).mean())
        placed = {name: float((image - TRANSFORMS[name](target)).pow(2).mean()) for name in wins}
        best = min(placed, key=placed.get)
        if torch.equal(target, TRANSFORMS[best](target)):
            continue  # a symmetric target: no placement can be read from it
        scored += 1
        if placed[best] <= CLOSER * given:
            wins[best] += 1
    name = max(wins, key=wins.get)
    if scored and wins[name] >= MIN_SAMPLES and wins[name] >= MIN_SHARE * scored:
        return name, wins[name], scored
    return None


def _indicators(mask: torch.Tensor) -> list[torch.Tensor]:
    """What of the target each image channel is compared with: each class's indicator of a
    (H, W) class map, each map of (K, H, W) soft maps."""
    if mask.is_floating_point():
        return [channel.reshape(-1) for channel in mask[:MAX_CLASSES]]
    return [(mask.reshape(-1) == label).float() for label in torch.unique(mask)[:MAX_CLASSES]]


def lies_on(image: torch.Tensor, mask: torch.Tensor) -> float:
    """The strongest |correlation| between one channel of ``image`` (C, H, W) and the
    indicator of one class of ``mask`` (H, W), or one of soft maps (K, H, W), over the pixels."""
    pixels = image.reshape(image.shape[0], -1)
    pixels = pixels - pixels.mean(1, keepdim=True)
    pixel_norm = pixels.norm(dim=1).clamp_min(1e-12)
    best = 0.0
    for indicator in _indicators(mask):
        if float(indicator.std()) == 0:
            continue
        indicator = indicator - indicator.mean()
        correlation = (pixels @ indicator) / (pixel_norm * indicator.norm())
        best = max(best, float(correlation.abs().max()))
    return best


def misplaced(images: torch.Tensor, masks: torch.Tensor) -> tuple[str, int, int] | None:
    """(how the mask lies better, in how many samples, of how many) (pure)."""
    volume = is_volume(masks)
    transforms = transforms_for(tuple(masks.shape[-3:] if volume else masks.shape[-2:]))
    strong = STRONG_VOLUME if volume else STRONG
    wins = {name: 0 for name in transforms}
    scored = 0
    for image, mask in zip(images[:MAX_SAMPLES], masks[:MAX_SAMPLES], strict=True):
        given = lies_on(image, mask)
        placed = {name: lies_on(image, transform(mask)) for name, transform in transforms.items()}
        if max(given, *placed.values()) < strong:
            continue
        scored += 1
        best = max(placed, key=placed.get)
        clearly = (placed[best] >= given + VOLUME_GAIN and placed[best] >= VOLUME_RATIO * given) if volume \
            else placed[best] >= BETTER * given + MARGIN
        if placed[best] >= strong and clearly:
            wins[best] += 1
    name = max(wins, key=wins.get)
    if scored and wins[name] >= MIN_SAMPLES and wins[name] >= MIN_SHARE * scored:
        return name, wins[name], scored
    return None


SHIFT_SAMPLES = 16  # samples tried at every offset (the search is the costly part)
MAX_SHIFT = 8  # pixels, and at most three eighths of the side (a 16-pixel crop of a 22-pixel tile moves 6)
# A mask moved off its image by a pixel or two still overlaps it, so the placement that lies on
# the image is not twice as good, only clearly better; a mask on its image loses at every offset.
SHIFT_GAIN = 0.2
SHIFT_RATIO = 1.3


def shifted(images: torch.Tensor, masks: torch.Tensor) -> tuple[int, int, list[tuple[int, int]]] | None:
    """(samples whose mask lies far better moved by a few pixels, samples scored, their offsets)
    when that is a good share of them (pure): an image and a mask cropped at different places."""
    reach = min(MAX_SHIFT, masks.shape[-1] * 3 // 8, masks.shape[-2] * 3 // 8)
    if reach < 1:
        return None
    offsets = [(dy, dx) for dy in range(-reach, reach + 1) for dx in range(-reach, reach + 1) if (dy, dx) != (0, 0)]
    wins, scored, moved = 0, 0, []
    for image, mask in zip(images[:SHIFT_SAMPLES], masks[:SHIFT_SAMPLES], strict=False):
        given = lies_on(image, mask)
        placed = {offset: lies_on(image, mask.roll(offset, dims=(-2, -1))) for offset in offsets}
        best = max(placed, key=placed.get)
        if max(given, placed[best]) < STRONG:
            continue
        scored += 1
        if placed[best] >= given + SHIFT_GAIN and placed[best] >= SHIFT_RATIO * given:
            wins += 1
            moved.append(best)
    if scored and wins >= MIN_SAMPLES and wins >= MIN_SHARE * scored:
        return wins, scored, moved
    return None


class MaskAlignmentCheck(Check):
    """MASK_MISALIGNED: segmentation masks that lie on their images only once transformed."""

    name = "data.mask_alignment"
    stage = Stage.DATA
    codes = ("MASK_MISALIGNED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        pair = image_and_mask(ctx.artifacts.first_batch)
        if pair is None:
            images = image_target_pair(ctx.artifacts.first_batch)
            if images is not None:
                self._image_targets(images, findings)
                return
            findings.data["summary"] = "no (image, mask) pair in the batch"
            return
        wanted = min(VOLUME_SAMPLES, VOLUME_VOXELS // max(pair[1][0].numel(), 1)) if is_volume(pair[1]) else 0
        if len(pair[1]) < wanted:  # 3-D batches are a few volumes: read more, within a memory budget
            parts = read_samples(ctx, self.name, findings, ctx.train_loader, f"training volumes for {self.name}",
                                 volume_and_mask, wanted, VOLUME_BUDGET_S)
            if parts:
                pair = (torch.cat([volume for volume, _ in parts]), torch.cat([mask for _, mask in parts]))
        found = misplaced(*pair)
        findings.data["summary"] = "masks lie on their images" if found is None else "masks misplaced"
        if found is None:
            if is_volume(pair[1]):  # label volumes: no shift search (a cube of offsets per sample)
                return
            images = image_target_pair(ctx.artifacts.first_batch)
            if not self._shifted(pair, findings) and images is not None:
                self._image_targets(images, findings)  # soft maps in [0, 1] that are images: a denoiser's targets
            return
        how, wins, scored = found
        if pair[1].is_floating_point() and how.startswith("transposed"):
            findings.warning(
                "MASK_MISALIGNED",
                f"in {wins} of {scored} samples of the first batch the target heatmaps lie on their images far better "
                "transposed (rows and columns swapped) than as given: each peak sits at (row=x, column=y), the "
                "landmark's mirror across the diagonal, so the model is trained to put it there. The likely cause: "
                "the Gaussians were drawn on grids from np.meshgrid(..., indexing='ij') (or torch.meshgrid's default "
                "'ij'), whose first grid varies along the rows, with a formula that reads it as x; or heatmap[x, y] "
                "written where heatmap[y, x] was meant",
                "Draw the maps on xx, yy = np.meshgrid(np.arange(W), np.arange(H)) (NumPy's default indexing='xy': xx "
                "varies along the columns), or torch.meshgrid(ys, xs, indexing='ij') unpacked as yy, xx; index pixels "
                "as heatmap[y, x].",
            )
            return
        every = wins >= 0.9 * scored
        if how == AXES_REVERSED and every:
            findings.warning(
                "MASK_MISALIGNED",
                f"in {wins} of {scored} samples of the first batch the label volume lies on its image far better "
                f"{how} than as given: image and labels hold their axes in opposite orders, so every voxel is scored "
                "against the label at its mirrored position. Arrays from two readers do this: SimpleITK / ITK "
                "(GetArrayFromImage) give (z, y, x), nibabel's get_fdata() (x, y, z); cubic patches pass every shape "
                "check",
                "Read the image and its labels with the same library, or reverse one of them: labels.permute(0, 3, 2, "
                "1) for (B, x, y, z) labels beside (B, z, y, x) images (np.transpose(arr, (2, 1, 0)) per volume).",
            )
            return
        cause = ("the image and the mask go through different axis orders: an NHWC image made channels-first with "
                 "transpose(1, 3), which gives (B, C, W, H), or a mask transposed on its own" if how.startswith("transposed")
                 else "a flip or rotation applied to the image and not to its mask") if every else \
            ("the image and its mask went through separate random draws: flipped or rotated independently (two "
             "RandomHorizontalFlip transforms, or one random transform called once on the image and again on the "
             "mask, each tossing its own coins), so in those samples the mask is misaligned with its image; or a "
             "random augmentation (flip, rotation, transpose) applied to the image and not to its mask")
        findings.warning(
            "MASK_MISALIGNED",
            f"in {wins} of {scored} samples of the first batch the mask lies on its image far better {how} than as "
            f"given: the pixels are scored against the labels of other pixels. The likely cause: {cause}",
            "Give the image and its mask the same spatial transform: permute(0, 3, 1, 2) (not transpose(1, 3)) for "
            "NHWC images, and one random draw shared by the image and its mask (torchvision.transforms.v2 called "
            "once on both, with tv_tensors.Mask, or the same flip and rotation decisions applied to each).",
        )

    @staticmethod
    def _image_targets(pair: tuple[torch.Tensor, torch.Tensor], findings: Findings) -> None:
        """Image-to-image targets that lie on their inputs only once flipped or rotated, in some
        samples and not all (a model trained to mirror every image is a task, not a draw)."""
        found = mirrored_targets(*pair)
        findings.data["summary"] = "targets lie on their inputs" if found is None else "targets misplaced"
        if found is None or found[1] >= 0.9 * found[2]:
            return
        how, wins, scored = found
        findings.warning(
            "MASK_MISALIGNED",
            f"in {wins} of {scored} samples of the first batch the target image lies far closer to its input {how} "
            "(half the squared distance or less) than as given, and in the others as given: the input and its target went through separate random "
            "draws, two coin tosses for one flip (or rotation), so those pairs are mirror images of each other and "
            "the model learns the average of an image and its mirror",
            "Draw the random transform once per sample and apply it to both: flip = random.random() < 0.5, then "
            "flip the input and the target alike (or call one torchvision.transforms.v2 transform on the pair).",
        )

    @staticmethod
    def _shifted(pair: tuple[torch.Tensor, torch.Tensor], findings: Findings) -> bool:
        found = shifted(*pair)
        if found is None:
            return False
        wins, scored, moved = found
        varied = len(set(moved)) > 1
        listed = ", ".join(f"({dy:+d}, {dx:+d})" for dy, dx in moved[:5])
        findings.data["summary"] = "masks offset from their images"
        if pair[1].is_floating_point():  # soft maps: keypoint heatmaps, whose peaks are the labels
            findings.warning(
                "MASK_MISALIGNED",
                f"in {wins} of {scored} samples of the first batch the target heatmap lies on its image far better "
                f"moved by a few pixels than as given (offsets (rows, columns) {listed}"
                + (": a different one for each sample" if varied else "") + "): its peaks no longer sit on the "
                "keypoints they label, and the model is trained to point beside them. The likely cause: "
                + ("a random shift (translation, roll or crop) applied to the image and not to the target heatmap, "
                   "or with other offsets" if varied else
                   "a crop, pad or resize applied to the image with other offsets than to the heatmaps"),
                "Move the heatmap (and the keypoints it is drawn from) with the image: apply the same offsets to "
                "both (torch.roll(heatmap, (dy, dx), (-2, -1)) beside the image's), or draw the heatmap from the "
                "keypoints after the augmentation.",
            )
            return True
        findings.warning(
            "MASK_MISALIGNED",
            f"in {wins} of {scored} samples of the first batch the mask lies on its image far better moved by a few "
            f"pixels than as given (offsets (rows, columns) {listed}"
            + (": a different one for each sample" if varied else "") + "): the pixels are scored against the "
            "labels of pixels beside them, and the model learns blurred, shifted outlines. The likely cause: "
            + ("the image and the mask were cropped at different places, two random crops each drawing its own "
               "offsets" if varied else "a crop, pad or resize applied to the image with other offsets than to the mask"),
            "Draw the crop once and apply it to both (i, j = random offsets; image[..., i:i + h, j:j + w] and "
            "mask[..., i:i + h, j:j + w]), or use one joint transform (torchvision.transforms.v2 with tv_tensors.Mask).",
        )
        return True
