"""Dense targets that do not lie on their images (``data.mask_alignment``).

A segmentation batch pairs ``(B, C, H, W)`` images with ``(B, H, W)`` masks. An image made
channels-first with ``transpose(1, 3)`` is ``(B, C, W, H)``: for square images every shape
matches and each pixel is scored against the mask at the transposed position. A random
flip or rotation applied to the image and not to its mask does the same to some samples.

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
MIN_SAMPLES = 4

TRANSFORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "transposed (height and width swapped)": lambda m: m.transpose(-1, -2),
    "flipped left-right": lambda m: m.flip(-1),
    "flipped upside down": lambda m: m.flip(-2),
    "rotated by 180 degrees": lambda m: m.flip(-1, -2),
}


def image_and_mask(batch: object) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(images (B, C, H, W), masks (B, H, W) as class ids) of a segmentation batch."""
    found = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)]
    masks = [leaf for leaf in found if leaf.dim() in (3, 4) and not leaf.is_floating_point() and leaf.shape[-1] > 1
             and (leaf.dim() == 3 or leaf.shape[1] == 1)]
    images = [leaf for leaf in found if leaf.dim() == 4 and leaf.is_floating_point()]
    if len(masks) != 1 or not images:
        return None
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


def lies_on(image: torch.Tensor, mask: torch.Tensor) -> float:
    """The strongest |correlation| between one channel of ``image`` (C, H, W) and the
    indicator of one class of ``mask`` (H, W), over the pixels."""
    pixels = image.reshape(image.shape[0], -1)
    pixels = pixels - pixels.mean(1, keepdim=True)
    pixel_norm = pixels.norm(dim=1).clamp_min(1e-12)
    best = 0.0
    for label in torch.unique(mask)[:MAX_CLASSES]:
        indicator = (mask.reshape(-1) == label).float()
        if indicator.sum() in (0, indicator.numel()):
            continue
        indicator = indicator - indicator.mean()
        correlation = (pixels @ indicator) / (pixel_norm * indicator.norm())
        best = max(best, float(correlation.abs().max()))
    return best


def misplaced(images: torch.Tensor, masks: torch.Tensor) -> tuple[str, int, int] | None:
    """(how the mask lies better, in how many samples, of how many) (pure)."""
    wins = {name: 0 for name in TRANSFORMS}
    scored = 0
    square = masks.shape[-1] == masks.shape[-2]
    for image, mask in zip(images[:MAX_SAMPLES], masks[:MAX_SAMPLES], strict=True):
        given = lies_on(image, mask)
        placed = {name: lies_on(image, transform(mask)) for name, transform in TRANSFORMS.items()
                  if square or not name.startswith("transposed")}
        if max(given, *placed.values()) < STRONG:
            continue
        scored += 1
        best = max(placed, key=placed.get)
        if placed[best] >= STRONG and placed[best] >= BETTER * given + MARGIN:
            wins[best] += 1
    name = max(wins, key=wins.get)
    if scored and wins[name] >= MIN_SAMPLES and wins[name] >= MIN_SHARE * scored:
        return name, wins[name], scored
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
            findings.data["summary"] = "no (image, mask) pair in the batch"
            return
        found = misplaced(*pair)
        findings.data["summary"] = "masks lie on their images" if found is None else "masks misplaced"
        if found is None:
            return
        how, wins, scored = found
        every = wins >= 0.9 * scored
        cause = ("the image and the mask go through different axis orders: an NHWC image made channels-first with "
                 "transpose(1, 3), which gives (B, C, W, H), or a mask transposed on its own" if how.startswith("transposed")
                 else "a flip or rotation applied to the image and not to its mask") if every else \
            "a random augmentation (flip, rotation, transpose) applied to the image and not to its mask"
        findings.warning(
            "MASK_MISALIGNED",
            f"in {wins} of {scored} samples of the first batch the mask lies on its image far better {how} than as "
            f"given: the pixels are scored against the labels of other pixels. The likely cause: {cause}",
            "Give the image and its mask the same spatial transform: permute(0, 3, 1, 2) (not transpose(1, 3)) for "
            "NHWC images, and one joint random transform for both (torchvision.transforms.v2 with tv_tensors.Mask, "
            "or the same flip decision applied to each).",
        )
