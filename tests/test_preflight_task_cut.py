"""TASK_LOSS_CUT: layers that feed the model's output only through argmin/argmax, so the task
term never reaches them (a vector quantiser without the straight-through estimator); the
straight-through version, where only the codebook is out of the task's reach by design, and an
argmax over the model's own logits stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, GradientsCheck


class Quantised(nn.Module):
    def __init__(self, straight_through: bool):
        super().__init__()
        torch.manual_seed(0)
        self.straight_through = straight_through
        self.encoder = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
        self.codebook = nn.Embedding(8, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        z_e = self.encoder(x)
        z_q = self.codebook(torch.cdist(z_e, self.codebook.weight).argmin(-1))
        z = z_e + (z_q - z_e).detach() if self.straight_through else z_q
        return self.head(z), z_e, z_q


def vq_loss(model, batch):
    x, y = batch
    logits, z_e, z_q = model(x)
    return F.cross_entropy(logits, y) + F.mse_loss(z_q, z_e.detach()) + 0.25 * F.mse_loss(z_e, z_q.detach())


def cut(model, loss) -> list:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 12, generator=g), torch.randint(0, 3, (256,), generator=g))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=32),
                           loss_fn=loss, checks=[FirstBatchCheck(), FirstStepCheck(), GradientsCheck()])
    return [i for i in report.check("step.gradients").issues if i.code == "TASK_LOSS_CUT"]


@pytest.mark.parametrize("straight_through", [False, True])
def test_a_quantiser_without_the_straight_through_estimator(straight_through):
    found = cut(Quantised(straight_through), vq_loss)
    assert bool(found) == (not straight_through)
    if found:
        assert "encoder.0.weight" in found[0].message and "z_e + (z_q - z_e).detach()" in found[0].fix
        assert "codebook" not in found[0].message.split("(")[1].split(")")[0]


def test_an_argmax_over_the_models_own_scores_is_not_a_cut():
    # a second pass fed the first pass's argmax (greedy feedback): the task still reaches every layer
    class Feedback(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.first, self.embed, self.second = nn.Linear(12, 3), nn.Embedding(3, 12), nn.Linear(12, 3)

        def forward(self, x):
            scores = self.first(x)
            return scores + self.second(x + self.embed(scores.argmax(-1)))

    assert not cut(Feedback(), lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]))
