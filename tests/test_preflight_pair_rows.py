"""LOSS_PAIR_ROWS_INTERLEAVED: (B, 3, d) triplets flattened sample by sample into one forward and
split with .chunk(3), so each block mixes anchors, positives and negatives; the roles unbound
from a (B, 3, D) view, and triplets stacked role by role before the forward, stay quiet.
TARGET_TILED: five crops of each image kept together in the forward, their labels tiled with
.repeat(5); repeat_interleave, and crops stacked crop by crop beside .repeat(5), stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, LossFunctionCheck


def triplet_loss(layout: str):
    def loss(model, batch):
        triplets = batch[0]  # (B, 3, d): anchor, positive, negative
        if layout == "role_major":
            embeddings = model(triplets.transpose(0, 1).reshape(-1, triplets.shape[-1]))
            anchor, positive, negative = embeddings.chunk(3)
        else:
            embeddings = model(triplets.reshape(-1, triplets.shape[-1]))  # rows a0, p0, n0, a1, ...
            if layout == "chunked":
                anchor, positive, negative = embeddings.chunk(3)
            else:
                anchor, positive, negative = embeddings.view(-1, 3, embeddings.shape[-1]).unbind(1)
        return F.triplet_margin_loss(anchor, positive, negative)
    return loss


@pytest.mark.parametrize("layout, fires", [("chunked", True), ("unbound", False), ("role_major", False)])
def test_interleaved_triplets_split_with_chunk(layout, fires):
    g = torch.Generator().manual_seed(0)
    triplets = torch.randn(256, 3, 12, generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 8))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(triplets, torch.zeros(256)), batch_size=32, shuffle=True),
                           loss_fn=triplet_loss(layout), checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "LOSS_PAIR_ROWS_INTERLEAVED"]
    assert bool(found) == fires
    if fires:
        assert "(32, 3, 12)" in found[0].message and ".unbind(1)" in found[0].fix


def five_crop_loss(expand: str):
    def loss(model, batch):
        crops, labels = batch  # (B, 5, d): five crops of each image
        if expand == "view_major":
            logits = model(crops.transpose(0, 1).reshape(-1, crops.shape[-1]))  # crop 0 of every image, then crop 1
            return F.cross_entropy(logits, labels.repeat(5))
        logits = model(crops.reshape(-1, crops.shape[-1]))  # image 0's five crops, then image 1's
        target = labels.repeat(5) if expand == "repeat" else labels.repeat_interleave(5)
        return F.cross_entropy(logits, target)
    return loss


@pytest.mark.parametrize("expand, fires", [("repeat", True), ("repeat_interleave", False), ("view_major", False)])
def test_labels_tiled_beside_crops_kept_together(expand, fires):
    g = torch.Generator().manual_seed(0)
    crops, labels = torch.randn(256, 5, 12, generator=g), torch.randint(0, 4, (256,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 4))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(crops, labels), batch_size=32, shuffle=True),
                           loss_fn=five_crop_loss(expand), checks=[FirstBatchCheck(), FirstStepCheck(), LossFunctionCheck()])
    found = [i for i in report.check("step.loss_function").issues if i.code == "TARGET_TILED"]
    assert bool(found) == fires
    if fires:
        assert ".repeat(5)" in found[0].message and "repeat_interleave(5)" in found[0].fix
