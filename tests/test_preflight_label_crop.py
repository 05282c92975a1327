"""LABELS_CROPPED_TO_OUTPUT: a stride-4 detector whose frame labels are cut to its output's
length (y[:, :T // 4]) instead of subsampled (y[:, ::4]); the subsampled labels, and a model
that keeps every frame, stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.label_crop import LabelCropCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class Detector(nn.Module):
    def __init__(self, stride: int):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(8, 1, kernel_size=stride, stride=stride)

    def forward(self, x):  # (B, 8, T) -> (B, T / stride)
        return self.conv(x).squeeze(1)


@pytest.mark.parametrize("labels, stride, fires", [("crop", 4, True), ("subsample", 4, False), ("as_is", 1, False)])
def test_frame_labels_cut_to_a_strided_output(labels, stride, fires):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 8, 64, generator=g), (torch.rand(128, 64, generator=g) < 0.3).float()

    def loss(model, batch):
        logits = model(batch[0])
        target = {"crop": batch[1][:, :logits.shape[1]], "subsample": batch[1][:, ::stride], "as_is": batch[1]}[labels]
        return F.binary_cross_entropy_with_logits(logits, target)

    model = Detector(stride)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=16), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LabelCropCheck()])
    issues = report.check("step.label_crop").issues
    assert [i.code for i in issues] == (["LABELS_CROPPED_TO_OUTPUT"] if fires else [])
    if issues:
        assert "labels[:, :16]" in issues[0].message and "labels[:, ::4]" in issues[0].fix
