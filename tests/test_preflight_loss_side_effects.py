"""LOSS_FN_SIDE_EFFECT: a loss function that steps the scheduler or the optimizer itself (a
training-loop body pasted into loss_fn); a plain loss stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


def findings(body: str) -> list:
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    def loss_fn(m, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(m(x), y)
        if body == "optimizer_step":
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
        if body == "scheduler_step":
            scheduler.step()
        return loss

    x, y = torch.randn(256, 8), torch.randint(0, 3, (256,))
    report = run_preflight(model, optimizer, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True),
                           loss_fn=loss_fn, checks=[FirstBatchCheck(), FirstStepCheck()])
    return [i for i in report.check("step.first_step").issues if i.code == "LOSS_FN_SIDE_EFFECT"]


@pytest.mark.parametrize("body, says", [("optimizer_step", "optimizer.step()"), ("scheduler_step", "scheduler.step()")])
def test_a_loss_function_that_steps_the_loop_itself_is_an_error(body, says):
    found = findings(body)
    assert found and says in found[0].message


def test_a_plain_loss_is_quiet():
    assert not findings("plain")


class IntentClassifier(nn.Module):
    """Word-level embedding dropout: whole rows of the table masked for a training step."""

    def __init__(self, in_place: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head, self.in_place = nn.Embedding(200, 16), nn.Linear(16, 3), in_place

    def forward(self, ids):
        weight = self.emb.weight
        if self.training:
            keep = (torch.rand(weight.shape[0], 1) > 0.1).float()
            if self.in_place:
                weight.data.mul_(keep)  # wipes the trained rows themselves
            else:
                weight = weight * keep
        return self.head(nn.functional.embedding(ids, weight).mean(1))


@pytest.mark.parametrize("in_place", [True, False], ids=["weight_data_mul_", "masked_copy"])
def test_embedding_dropout_written_into_the_weight_is_named(in_place):
    g = torch.Generator().manual_seed(1)
    model = IntentClassifier(in_place)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(torch.randint(0, 200, (256, 12), generator=g),
                                                    torch.randint(0, 3, (256,), generator=g)), batch_size=32),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck()])
    found = [i for i in report.check("step.first_step").issues if i.code == "LOSS_FN_SIDE_EFFECT"]
    assert bool(found) == in_place
    if found:
        assert "writes zeros into the model's own weights" in found[0].message and "weight * mask" in found[0].fix


class MomentumEncoders(nn.Module):
    """MoCo: a trained query encoder and a frozen key encoder that should follow it."""

    def __init__(self, backwards: bool, start_equal: bool):
        super().__init__()
        torch.manual_seed(0)
        self.backwards = backwards
        self.query, self.key = nn.Linear(12, 8), nn.Linear(12, 8)
        if start_equal:
            self.key.load_state_dict(self.query.state_dict())
        self.key.requires_grad_(False)

    def forward(self, x1, x2):
        with torch.no_grad():
            for q, k in zip(self.query.parameters(), self.key.parameters()):
                if self.backwards:
                    q.data = q.data * 0.9 + k.data * 0.1
                else:
                    k.data = k.data * 0.9 + q.data * 0.1
        return nn.functional.normalize(self.query(x1), dim=1), nn.functional.normalize(self.key(x2), dim=1)


@pytest.mark.parametrize("backwards, start_equal", [(True, False), (True, True), (False, False)],
                         ids=["backwards", "backwards_from_a_copy", "key_follows_query"])
def test_a_momentum_update_written_onto_the_trained_encoder(backwards, start_equal):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 12, generator=g)
    model = MomentumEncoders(backwards, start_equal)

    def moco(model, batch):
        q, k = model(batch[0], batch[1])
        return nn.functional.cross_entropy(q @ k.T / 0.2, torch.arange(len(q)))

    report = run_preflight(model, torch.optim.Adam(model.query.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, x + 0.1 * torch.randn(256, 12, generator=g)), batch_size=32),
                           loss_fn=moco, checks=[FirstBatchCheck(), FirstStepCheck()])
    found = [i for i in report.check("step.first_step").issues if i.code == "LOSS_FN_SIDE_EFFECT"]
    assert bool(found) == backwards
    if found:
        assert "momentum (EMA) update" in found[0].message and "written backwards" in found[0].message
        assert "k.mul_(m)" in found[0].fix
        assert ("part of the way towards a frozen copy" in found[0].message) == (not start_equal)


@pytest.mark.parametrize("swapped", [True, False])
def test_a_target_networks_soft_update_with_its_arguments_swapped(swapped):
    """The target network is held by the loss function, not the model: a DQN's TD loss."""
    torch.manual_seed(0)
    online = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    target = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3)).requires_grad_(False)

    def soft_update(to, source, tau=0.05):
        for t, s in zip(to.parameters(), source.parameters()):
            t.data.mul_(1 - tau).add_(tau * s.data)

    def td_loss(model, batch):
        s, a, r, s2 = batch
        soft_update(model, target) if swapped else soft_update(target, model)
        with torch.no_grad():
            y = r + 0.9 * target(s2).max(1).values
        return nn.functional.mse_loss(model(s).gather(1, a[:, None]).squeeze(1), y)

    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(256, 6, generator=g), torch.randint(0, 3, (256,), generator=g),
                         torch.randn(256, generator=g), torch.randn(256, 6, generator=g))
    report = run_preflight(online, torch.optim.Adam(online.parameters(), 1e-3), DataLoader(data, batch_size=32),
                           loss_fn=td_loss, checks=[FirstBatchCheck(), FirstStepCheck()])
    found = [i for i in report.check("step.first_step").issues if i.code == "LOSS_FN_SIDE_EFFECT"]
    assert bool(found) == swapped
    if found:
        assert "part of the way towards a frozen copy" in found[0].message and "arguments swapped" in found[0].message


class FakeQuantLinear(nn.Linear):
    """Quantisation-aware training with 3-bit weights: written back into weight.data (the bug) or
    applied to a copy with a straight-through estimator."""

    def __init__(self, in_place: bool):
        super().__init__(16, 3)
        self.in_place = in_place

    def forward(self, x):
        scale = self.weight.detach().abs().max() / 3
        quantised = (self.weight / scale).round().clamp(-4, 3) * scale
        if self.in_place:
            self.weight.data.copy_(quantised)  # every update smaller than half a step is rounded away
            return super().forward(x)
        return nn.functional.linear(x, self.weight + (quantised - self.weight).detach(), self.bias)


@pytest.mark.parametrize("in_place", [True, False], ids=["weight_data_overwritten", "straight_through"])
def test_fake_quantisation_written_into_the_weights_is_named(in_place):
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(0)
    model = FakeQuantLinear(in_place)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(torch.randn(256, 16, generator=g),
                                                    torch.randint(0, 3, (256,), generator=g)), batch_size=32),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck()])
    found = [i for i in report.check("step.first_step").issues if i.code == "LOSS_FN_SIDE_EFFECT"]
    assert bool(found) == in_place
    if found:
        assert "quantised values" in found[0].message and "straight-through" in found[0].fix
