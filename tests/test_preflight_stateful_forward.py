"""step.stateful_forward: an LSTM that keeps its last hidden state on self and starts the
next batch from it, under a shuffling loader (STATE_CARRIED_ACROSS_BATCHES); the same model
over batches read in order, a stateless LSTM, and a model that samples noise in its forward
stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.stateful_forward import StatefulForwardCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from tests.preflight_support import assert_quiet


class Tagger(nn.Module):
    def __init__(self, stateful: bool):
        super().__init__()
        torch.manual_seed(0)
        self.stateful, self.lstm, self.head, self.hidden = stateful, nn.LSTM(4, 16, batch_first=True), nn.Linear(16, 2), None

    def forward(self, x):
        carried = self.hidden if self.stateful and self.hidden is not None and self.hidden[0].shape[1] == len(x) else None
        out, (h, c) = self.lstm(x, carried)
        self.hidden = (h.detach(), c.detach())  # the next batch starts here
        return self.head(out[:, -1])


class NoisyEncoder(nn.Module):
    """A recurrent encoder that samples a latent in every forward, eval mode included (a VAE's
    reparameterisation): random, but no state."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gru, self.head = nn.GRU(4, 8, batch_first=True), nn.Linear(8, 2)

    def forward(self, x):
        mean = self.gru(x)[1][-1]
        return self.head(mean + torch.randn_like(mean))


def run(model: nn.Module, shuffle: bool = True):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 4, 4, generator=g)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, (x[:, :, 0].mean(1) > 0).long()), batch_size=32, shuffle=shuffle),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), StatefulForwardCheck()])
    return report.check("step.stateful_forward")


def test_a_hidden_state_carried_into_shuffled_batches_fires():
    result = run(Tagger(stateful=True))
    issues = [i for i in result.issues if i.code == "STATE_CARRIED_ACROSS_BATCHES"]
    assert issues, result.data
    assert "'the model'" in issues[0].message and "self.hidden = None" in issues[0].fix


@pytest.mark.parametrize("model, shuffle", [(lambda: Tagger(stateful=True), False), (lambda: Tagger(stateful=False), True),
                                            (NoisyEncoder, True)],
                         ids=["batches_in_order", "stateless", "sampling_in_forward"])
def test_no_carried_state_or_batches_that_continue_each_other_stay_quiet(model, shuffle):
    assert_quiet(run(model(), shuffle))
