"""Class scores read from an NCHW convolution output along the wrong axes (analyses/channel_axis):
a softmax over one spatial axis (SOFTMAX_OVER_SPATIAL_AXIS), an anchor head's (N, A*C, H, W)
viewed as (N, -1, C), and transpose(1, 3) flattened against (N, H, W) masks on a square map,
where the shapes still agree (FLATTEN_ORDER_MISMATCH). The right reads stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.channel_axis import _split_channels
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def scenes(classes: int = 3, side: int = 12) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(128, 3, side, side, generator=g)
    masks = torch.randint(0, classes, (128, side, side), generator=g)
    return DataLoader(TensorDataset(images, masks), batch_size=16, shuffle=True)


def fcn(classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, classes, 1))


def found(model, loader, loss) -> list:
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), BatchLayoutCheck()])
    return [i for i in report.check("step.batch_layout").issues if i.severity.value in ("warning", "error")]


@pytest.mark.parametrize("dim, fires", [(-1, True), (2, True), (1, False)])
def test_a_soft_dice_normalised_over_a_spatial_axis(dim, fires):
    def dice(model, batch):
        images, masks = batch
        probs = F.softmax(model(images), dim=dim)
        onehot = F.one_hot(masks, 3).permute(0, 3, 1, 2).float()
        return 1 - (2 * (probs * onehot).sum((0, 2, 3)) / (probs.sum((0, 2, 3)) + onehot.sum((0, 2, 3)))).mean()

    issues = found(fcn(), scenes(), dice)
    assert [i.code for i in issues] == (["SOFTMAX_OVER_SPATIAL_AXIS"] if fires else [])
    if fires:
        assert "dim=1" in issues[0].fix


@pytest.mark.parametrize("flatten, fires", [("transpose", True), ("permute", False), ("as_is", False)])
def test_segmentation_scores_flattened_on_a_square_map(flatten, fires):
    def loss(model, batch):
        images, masks = batch
        logits = model(images)
        if flatten == "as_is":
            return F.cross_entropy(logits, masks)
        flat = logits.transpose(1, 3) if flatten == "transpose" else logits.permute(0, 2, 3, 1)
        return F.cross_entropy(flat.reshape(-1, 3), masks.reshape(-1))

    issues = found(fcn(), scenes(), loss)
    assert [i.code for i in issues] == (["FLATTEN_ORDER_MISMATCH"] if fires else [])
    if fires:
        assert "pixel (h, w) is scored against the label of pixel (w, h)" in issues[0].message


@pytest.mark.parametrize("permuted", [False, True])
def test_an_anchor_head_viewed_without_moving_the_channels_last(permuted):
    anchors, classes = 2, 3
    g = torch.Generator().manual_seed(1)
    images = torch.randn(96, 3, 8, 8, generator=g)
    targets = torch.randint(0, classes, (96, 8 * 8 * anchors), generator=g)  # ordered (row, column, anchor)
    torch.manual_seed(0)
    head = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, anchors * classes, 1))

    def loss(model, batch):
        x, y = batch
        out = model(x)
        scores = out.permute(0, 2, 3, 1).reshape(len(x), -1, classes) if permuted else out.view(len(x), -1, classes)
        return F.cross_entropy(scores.reshape(-1, classes), y.reshape(-1))

    issues = found(head, DataLoader(TensorDataset(images, targets), batch_size=16, shuffle=True), loss)
    assert [i.code for i in issues] == ([] if permuted else ["FLATTEN_ORDER_MISMATCH"])
    if not permuted:
        assert "permute(0, 2, 3, 1)" in issues[0].fix


@pytest.mark.parametrize("shape, result, split", [
    ((4, 6, 8, 8), (4, 128, 3), True),  # (N, A*C, H, W) viewed (N, -1, C)
    ((4, 6, 8, 8), (4, 6, 64), False),  # flattening the map keeps each channel's positions together
    ((4, 6, 8, 8), (4, 48, 8), False),  # rows of the map
    ((4, 6, 8, 8), (4, 3, 128), False),  # two whole maps per row
    ((4, 6, 1, 1), (4, 2, 3), False),  # a 1x1 map: the view is the layout
])
def test_which_views_split_the_channels(shape, result, split):
    assert _split_channels(shape, result) == split
