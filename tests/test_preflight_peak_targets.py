"""TARGET_PEAK_BELOW_ONE: a CenterNet-style focal loss that picks its positives with gt.eq(1)
on Gaussian heatmaps drawn around sub-pixel centres (no cell equals 1: the positive term is
empty); the same loss on Gaussians drawn at integer centre cells stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck

SIZE = 16


def heatmaps(subpixel: bool, samples: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    centres = 2 + torch.rand(samples, 2, generator=g) * (SIZE - 4)
    if not subpixel:
        centres = centres.round()
    rows, cols = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(), indexing="ij")
    maps = torch.exp(-((cols - centres[:, 0, None, None]) ** 2 + (rows - centres[:, 1, None, None]) ** 2) / 4.0)
    images = maps[:, None] + 0.1 * torch.randn(samples, 1, SIZE, SIZE, generator=g)
    return images, maps[:, None]


def centernet_focal(model, batch):
    images, gt = batch
    pred = torch.sigmoid(model(images)).clamp(1e-4, 1 - 1e-4)
    positive = gt.eq(1).float()
    negative = 1 - positive
    pos_loss = (torch.log(pred) * (1 - pred) ** 2 * positive).sum()
    neg_loss = (torch.log(1 - pred) * pred ** 2 * (1 - gt) ** 4 * negative).sum()
    return -(pos_loss + neg_loss) / positive.sum().clamp_min(1.0)


@pytest.mark.parametrize("subpixel", [True, False], ids=["sub_pixel_centres", "integer_centres"])
def test_positives_picked_by_eq_1_on_heatmaps_that_never_reach_1(subpixel):
    torch.manual_seed(0)
    model = nn.Conv2d(1, 1, 3, padding=1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(*heatmaps(subpixel)), batch_size=32, shuffle=True),
                           loss_fn=centernet_focal, checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "TARGET_PEAK_BELOW_ONE"]
    assert bool(found) == subpixel
    if found:
        assert "gt.eq(1)" in found[0].message and "heatmap[cy, cx] = 1" in found[0].fix
