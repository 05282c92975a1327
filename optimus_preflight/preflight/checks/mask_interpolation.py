"""Segmentation masks resized with interpolation (``data.mask_interpolation``).

``F.interpolate(mask.float(), size, mode='bilinear').long()`` (or a PIL ``resize`` with its
default filter) averages the class ids across every object edge and truncates: the border
of a class-3 object on background becomes a rim of class 2 or 1, classes that are not
there. The mask keeps its dtype and its set of ids, and the model learns the fake rims.

The signature, read from the integer (B, H, W) targets of the first batch: a class that is a
real object somewhere (pixels whose whole 3x3 neighbourhood is that class) also forms thin
rims elsewhere, one pixel wide and lying between a lower and a higher class id, the way an
average of the two would. A clean mask has such pixels only where three classes meet, or
where a band of the class narrows between two others and widens again (pixels joined to
the class's own interior, which an averaged edge around an object is not); a boundary
class of its own (nuclei, boundary, background) is thin everywhere and is never an object,
so it stays quiet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SIDE = 8
MAX_CLASSES = 64
MIN_PIXELS = 20  # of a class's object interior, and of its rims
RIM_SHARE = 0.2  # of the class's pixels that are rims between a lower and a higher id
VOID_FROM = MAX_CLASSES  # ids from here on mark pixels not to score (255), not a class


@dataclass
class Rims:
    klass: int
    rim_pixels: int
    class_pixels: int


def _spread(mask: torch.Tensor) -> torch.Tensor:
    """Whether any pixel of the 3x3 neighbourhood is set (B, H, W bool)."""
    return F.max_pool2d(mask.float().unsqueeze(1), 3, stride=1, padding=1).squeeze(1) > 0


def _joined_to(seeds: torch.Tensor, region: torch.Tensor) -> torch.Tensor:
    """The pixels of ``region`` 8-connected to ``seeds`` through ``region`` (B, H, W bool), along
    paths of up to twice the mask's perimeter: a band snaking further is cut off there."""
    reached = seeds & region
    for _ in range(2 * (region.shape[-1] + region.shape[-2])):
        grown = reached | (region & _spread(reached))
        if torch.equal(grown, reached):
            break
        reached = grown
    return reached


def interpolation_rims(masks: torch.Tensor) -> Rims | None:
    """The class with the most interpolation rims in integer (B, H, W) masks (pure)."""
    masks = masks.detach().cpu().long()
    worst: Rims | None = None
    for value in torch.unique(masks).tolist():
        own = masks == value
        # A pixel is interior when no pixel of its 3x3 neighbourhood is another class.
        interior = own & ~_spread(~own)
        # A void id (255 for unlabelled edges and borders) is not a class an average runs towards:
        # a class drawn inside a void band borders it on one side only, by design.
        rims = own & ~interior & _spread(masks < value) & _spread((masks > value) & (masks < VOID_FROM))
        # A rim is thin: it holds no interior pixel within its own neighbourhood either.
        rims &= ~_spread(interior)
        # An averaged edge is a ring of its own around an object; a thin stretch of a band that
        # widens into an object elsewhere (levels of a smooth field: elevation, intensity
        # classes) is the class itself, drawn narrow where the field is steep.
        rims &= ~_joined_to(interior, own)
        count, total = int(rims.sum()), int(own.sum())
        if int(interior.sum()) >= MIN_PIXELS and count >= MIN_PIXELS and count >= RIM_SHARE * total \
                and (worst is None or count > worst.rim_pixels):
            worst = Rims(int(value), count, total)
    return worst


def rim_shares(masks: torch.Tensor) -> dict[int, tuple[int, float]]:
    """Per class id: (its pixels, the share of them lying between a lower and a higher id),
    objects of any size (pure)."""
    masks = masks.detach().cpu().long()
    shares = {}
    for value in torch.unique(masks).tolist():
        if value >= VOID_FROM:
            continue
        own = masks == value
        between = own & _spread(masks < value) & _spread((masks > value) & (masks < VOID_FROM))
        total = int(own.sum())
        shares[int(value)] = (total, int(between.sum()) / max(total, 1))
    return shares


SPLIT_RIM_SHARE = 0.12  # of a class's training pixels lying between a lower and a higher id ...
SPLIT_RIM_RATIO = 3.0  # ... this many times validation's share: training's masks were interpolated


def rims_only_in_training(train: torch.Tensor, val: torch.Tensor) -> tuple[int, float, float] | None:
    """(class, training's between share, validation's) when training's masks have far more
    in-between pixels of a class than validation's (pure): small objects have no interior for
    interpolation_rims to compare with, but a validation set resized right does."""
    train_shares, val_shares = rim_shares(train), rim_shares(val)
    for value, (pixels, share) in sorted(train_shares.items(), key=lambda item: -item[1][1]):
        val_pixels, val_share = val_shares.get(value, (0, 0.0))
        if pixels >= MIN_PIXELS and val_pixels >= MIN_PIXELS and share >= SPLIT_RIM_SHARE \
                and share >= SPLIT_RIM_RATIO * val_share:
            return value, share, val_share
    return None


def mask_targets(batch) -> torch.Tensor | None:
    """The batch's integer (B, H, W) tensor of a few class ids: a segmentation target."""
    for leaf in leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() == 3 and not leaf.is_floating_point() \
                and leaf.dtype != torch.bool and min(leaf.shape[1:]) >= MIN_SIDE:
            values = torch.unique(leaf)
            if 2 < values.numel() <= MAX_CLASSES and int(values.min()) >= 0:
                return leaf
    return None


class MaskInterpolationCheck(Check):
    """MASK_INTERPOLATED: class-id masks resized by averaging, leaving rims of in-between ids."""

    name = "data.mask_interpolation"
    stage = Stage.DATA
    codes = ("MASK_INTERPOLATED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        masks = mask_targets(ctx.artifacts.first_batch)
        if masks is None:
            findings.data["summary"] = "no (B, H, W) class-id masks"
            return
        found = interpolation_rims(masks)
        findings.data["summary"] = (f"class {found.klass}: {found.rim_pixels} rim pixels" if found
                                    else "no interpolation rims")
        if found is None:
            self._against_validation(ctx, masks, findings)
            return
        findings.warning(
            "MASK_INTERPOLATED",
            f"the {tuple(masks.shape)} segmentation masks hold rims of class {found.klass} one pixel wide between a "
            f"lower and a higher class id ({found.rim_pixels} of its {found.class_pixels} pixels), while the same class "
            "is a whole object elsewhere: the masks were resized with interpolation (bilinear or bicubic, PIL's "
            "default resize filter) and cast back to integers, which averages the ids across every object edge and "
            "truncates them, so object borders carry classes that are not there and the model learns fake rims",
            "Resize masks with nearest-neighbour interpolation only: F.interpolate(mask[:, None].float(), size, "
            "mode='nearest')[:, 0].long(), transforms.Resize(size, interpolation=InterpolationMode.NEAREST), or "
            "PIL's mask.resize(size, Image.NEAREST); keep bilinear for the images.",
            "data.train",
        )

    def _against_validation(self, ctx: PreflightContext, masks: torch.Tensor, findings: Findings) -> None:
        if ctx.val_loader is None:
            return
        parts = read_samples(ctx, self.name, findings, ctx.val_loader, f"validation masks for {self.name}",
                             mask_targets, len(masks), 2.0)
        if not parts or any(part.shape[1:] != masks.shape[1:] for part in parts):
            return
        found = rims_only_in_training(masks, torch.cat(parts))
        if found is None:
            return
        klass, share, val_share = found
        findings.warning(
            "MASK_INTERPOLATED",
            f"{share:.0%} of the class-{klass} pixels of the {tuple(masks.shape)} training masks lie between a lower "
            f"and a higher class id, against {val_share:.0%} in the validation masks: the training masks were "
            "resized with interpolation (bilinear or bicubic, as for the images) and cast back to integers, which "
            "averages the ids across object edges and truncates them (a 2 next to a 0 becomes 1), so small objects "
            "are mostly labelled with a class that is not there",
            "Resize masks with nearest-neighbour interpolation only: F.interpolate(mask[None, None].float(), size, "
            "mode='nearest')[0, 0].long(), transforms.Resize(size, interpolation=InterpolationMode.NEAREST); keep "
            "bilinear for the images.",
            "data.train",
        )
