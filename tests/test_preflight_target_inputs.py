"""step.target_inputs: a GRU decoder teacher-forced with the target sequence itself fires
TARGETS_FED_TO_MODEL; the decoder fed the targets shifted right by one, and an autoencoder whose
target is its own input, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.target_inputs import TargetInputsCheck


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = nn.GRU(1, 16, batch_first=True), nn.GRU(1, 16, batch_first=True)
        self.out = nn.Linear(16, 1)

    def teacher(self, x, decoder_inputs):
        _, h = self.encoder(x.unsqueeze(-1))
        out, _ = self.decoder(decoder_inputs.unsqueeze(-1), h)
        return self.out(out).squeeze(-1)

    def forward(self, x):  # what evaluation calls: the same weights, decoding step by step
        return self.teacher(x, x[:, -1:].expand(-1, 6))


def teacher_forced(shifted: bool):
    def loss_fn(model, batch):
        x, y = batch
        decoder_inputs = torch.cat([x[:, -1:], y[:, :-1]], dim=1) if shifted else y
        return ((model.teacher(x, decoder_inputs) - y) ** 2).mean()
    return loss_fn


def windows():
    series = torch.sin(torch.arange(400) / 5.0) + 0.1 * torch.randn(400, generator=torch.Generator().manual_seed(0))
    x = torch.stack([series[i:i + 20] for i in range(370)])
    return x, torch.stack([series[i + 20:i + 26] for i in range(370)])


@pytest.mark.parametrize("shifted", [False, True])
def test_a_decoder_teacher_forced_with_the_targets_themselves(shifted):
    x, y = windows()
    torch.manual_seed(0)
    model = Seq2Seq()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=teacher_forced(shifted),
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetInputsCheck()])
    issues = report.check("step.target_inputs").issues
    assert [i.code for i in issues] == ([] if shifted else ["TARGETS_FED_TO_MODEL"])
    if issues:
        assert "decoder receives" in issues[0].message and "y[:, :-1]" in issues[0].fix


def test_an_autoencoder_reconstructing_its_input_is_quiet():
    x, _ = windows()
    model = nn.Sequential(nn.Linear(20, 8), nn.ReLU(), nn.Linear(8, 20))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, x.clone()), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), FirstStepCheck(), TargetInputsCheck()])
    result = report.check("step.target_inputs")
    assert result.issues == [] and result.data["summary"] == "no (B, H) float sequence targets"
