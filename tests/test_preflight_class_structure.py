"""step.class_structure, LOSS_SEPARATES_CLASSES: an embedding loss that is lower with each class
scattered than gathered (a contrastive loss with the other label convention); the right
convention, supervised contrastive, instance contrastive and a classifier stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.class_structure import ClassStructureCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def views():
    g = torch.Generator().manual_seed(0)
    classes = torch.randint(0, 4, (512,), generator=g)
    centres = torch.randn(4, 16, generator=g) * 2
    x = centres[classes] + torch.randn(512, 16, generator=g)
    return TensorDataset(x + 0.2 * torch.randn(512, 16, generator=g), x + 0.2 * torch.randn(512, 16, generator=g),
                         classes)


def pair_contrastive(convention: str):
    def loss_fn(model, batch, margin=1.0):
        a, b, cls = batch
        perm = torch.randperm(len(cls))
        same = (cls == cls[perm]).float()
        d = F.pairwise_distance(F.normalize(model(a), dim=1), F.normalize(model(b[perm]), dim=1))
        if convention == "flipped":
            return ((1 - same) * d ** 2 + same * F.relu(margin - d) ** 2).mean()
        return (same * d ** 2 + (1 - same) * F.relu(margin - d) ** 2).mean()
    return loss_fn


def supcon(model, batch, tau=0.1):
    a, b, cls = batch
    z = F.normalize(model(torch.cat([a, b])), dim=1)
    y = torch.cat([cls, cls])
    eye = torch.eye(len(y), dtype=torch.bool)
    logits = (z @ z.T / tau).masked_fill(eye, float("-inf"))
    positive = (y[:, None] == y[None, :]) & ~eye
    return -(logits.log_softmax(1).masked_fill(~positive, 0).sum(1) / positive.sum(1)).mean()


def instance_nce(model, batch, tau=0.1):
    a, b, _ = batch
    za, zb = F.normalize(model(a), dim=1), F.normalize(model(b), dim=1)
    return F.cross_entropy(za @ zb.T / tau, torch.arange(len(a)))


def classifier(model, batch):
    return F.cross_entropy(model(batch[0]), batch[2])


@pytest.mark.parametrize("loss_fn, fires", [
    (pair_contrastive("flipped"), True),
    (pair_contrastive("right"), False),
    (supcon, False),
    (instance_nce, False),
    (classifier, False),
], ids=["flipped_convention", "right_convention", "supcon", "instance_nce", "classifier"])
def test_an_embedding_loss_that_scatters_each_class(loss_fn, fires):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4 if loss_fn is classifier else 8))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(views(), batch_size=64),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck(), ClassStructureCheck()])
    result = report.check("step.class_structure")
    issues = [i for i in result.issues if i.code == "LOSS_SEPARATES_CLASSES"]
    assert bool(issues) == fires, result.data
    if issues:
        assert "y * d**2 + (1 - y) * relu(margin - d)**2" in issues[0].fix
