"""step.zero_features: samples that reach a linear head as all-zero vectors, the read-out of a
padded step of pad_packed_sequence (out[:, -1]); the last valid step (h_n) stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.checks.zero_features import ZeroFeaturesCheck


class ClipClassifier(nn.Module):
    def __init__(self, read: str):
        super().__init__()
        torch.manual_seed(0)
        self.read = read
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, frames, lengths):
        packed = pack_padded_sequence(frames, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, h_n = self.gru(packed)
        if self.read == "last_step":
            out, _ = pad_packed_sequence(out, batch_first=True)
            return self.head(out[:, -1])
        return self.head(h_n[-1])


def verdict(read: str) -> list:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 21, (128,), generator=g)
    frames = torch.randn(128, 20, 8, generator=g) * (torch.arange(20)[None, :, None] < lengths[:, None, None])
    labels = torch.randint(0, 3, (128,), generator=g)

    def loss(model, batch):
        x, n, y = batch
        return nn.functional.cross_entropy(model(x, n), y)

    model = ClipClassifier(read)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(frames, lengths, labels), batch_size=32, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), ZeroFeaturesCheck()])
    return report.check("step.zero_features").issues


@pytest.mark.parametrize("read", ["last_step", "h_n"])
def test_a_head_reading_padded_steps_gets_zeros(read):
    issues = verdict(read)
    if read == "last_step":
        assert len(issues) == 1 and "Linear 'head'" in issues[0].message and "h_n[-1]" in issues[0].fix
    else:
        assert not issues
