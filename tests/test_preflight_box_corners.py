"""BOX_CORNERS_UNORDERED: box targets an IoU/area term reads as (x1, y1, x2, y2) while they are
COCO's (x, y, width, height); corner boxes, converted centre boxes and the model's own boxes
stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.box_corners import inverted_corners
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck


def crops(n: int, fmt: str, seed: int = 0) -> TensorDataset:
    """One bright box per 20x20 crop; targets in [0, 1] as 'xywh' (COCO), 'xyxy' or 'cxcywh'."""
    g = torch.Generator().manual_seed(seed)
    images = 0.1 * torch.randn(n, 1, 20, 20, generator=g)
    boxes = []
    for i in range(n):
        w, h = (int(v) for v in torch.randint(3, 10, (2,), generator=g))
        x, y = int(torch.randint(0, 20 - w, (), generator=g)), int(torch.randint(0, 20 - h, (), generator=g))
        images[i, 0, y:y + h, x:x + w] += 1
        box = {"xywh": [x, y, w, h], "xyxy": [x, y, x + w, y + h], "cxcywh": [x + w / 2, y + h / 2, w, h]}[fmt]
        boxes.append(box)
    return TensorDataset(images, torch.tensor(boxes, dtype=torch.float32) / 20)


def iou_loss(model, batch):
    """L1 + (1 - IoU), both boxes read as corners: the way detection tutorials write it."""
    images, box = batch
    pred = model(images)
    lt = torch.maximum(pred[:, :2], box[:, :2])
    rb = torch.minimum(pred[:, 2:], box[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    area_p = (pred[:, 2:] - pred[:, :2]).clamp(min=0).prod(1)
    area_b = (box[:, 2:] - box[:, :2]).clamp(min=0).prod(1)
    return F.l1_loss(pred, box) + (1 - inter / (area_p + area_b - inter + 1e-6)).mean()


def centre_iou_loss(model, batch):
    """Centre-format targets converted to corners before the same IoU: healthy."""
    images, box = batch
    corners = torch.cat([box[:, :2] - box[:, 2:] / 2, box[:, :2] + box[:, 2:] / 2], 1)
    return iou_loss(model, (images, corners))


def regressor() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(),
                         nn.Linear(8 * 25, 4), nn.Sigmoid())


def box_findings(fmt: str, loss_fn) -> list:
    model = regressor()
    loader = DataLoader(crops(128, fmt), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    return [i for i in report.check("step.loss_function").issues if i.code == "BOX_CORNERS_UNORDERED"]


def test_coco_boxes_read_as_corners_by_an_iou_loss_are_named():
    found = box_findings("xywh", iou_loss)
    assert len(found) == 1 and found[0].severity.value == "warning"
    assert "(x, y, width, height)" in found[0].message and "box_convert" in found[0].fix


@pytest.mark.parametrize("fmt, loss_fn", [("xyxy", iou_loss), ("cxcywh", centre_iou_loss)])
def test_corner_boxes_and_converted_centre_boxes_stay_quiet(fmt, loss_fn):
    assert box_findings(fmt, loss_fn) == []


def test_only_columns_of_one_data_tensor_two_apart_are_read():
    boxes = crops(64, "xywh").tensors[1]
    assert inverted_corners("sub", (boxes[:, 2:], boxes[:, :2])) is not None
    assert inverted_corners("__sub__", (boxes[:, 2], boxes[:, 0])) is not None
    assert inverted_corners("sub", (boxes[:, 1:3], boxes[:, :2])) is None  # not a corner pair
    assert inverted_corners("sub", (boxes[:, 2:] * 1, boxes[:, :2])) is None  # a computed tensor, not a column
    predicted = boxes.clone().requires_grad_(True)
    assert inverted_corners("sub", (predicted[:, 2:], predicted[:, :2])) is None  # the model's boxes at init
    wide = torch.rand(64, 6)
    assert inverted_corners("sub", (wide[:, 2:4], wide[:, :2])) is None  # six columns: not one box per row
