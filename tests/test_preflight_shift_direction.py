"""data.shift_direction: next-token targets shifted the wrong way (inputs seq[:, 1:], targets
seq[:, :-1]) fire TARGETS_SHIFTED_BACK; the right shift, a mapping batch with labels equal to
the input_ids (the model shifts), and aligned tags stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.shift_direction import ShiftDirectionCheck, backward_share

VOCAB = 30


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.rnn, self.head = nn.Embedding(VOCAB, 16), nn.GRU(16, 16, batch_first=True), nn.Linear(16, VOCAB)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


def seqs() -> torch.Tensor:
    return torch.randint(0, VOCAB, (256, 13), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("shift", ["backward", "forward"])
def test_targets_that_are_the_previous_token_fire(shift):
    s = seqs()
    inputs, targets = (s[:, 1:], s[:, :-1]) if shift == "backward" else (s[:, :-1], s[:, 1:])
    model = TinyLM()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(inputs, targets), batch_size=32, shuffle=True),
                           loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten()),
                           checks=[FirstBatchCheck(), ShiftDirectionCheck()])
    issues = report.check("data.shift_direction").issues
    assert [i.code for i in issues] == (["TARGETS_SHIFTED_BACK"] if shift == "backward" else [])
    if issues:
        assert "seq[:, :-1], seq[:, 1:]" in issues[0].fix


def test_labels_equal_to_the_inputs_and_aligned_tags_read_as_neither_shift():
    s = seqs()
    assert backward_share(s, s)[0] < 0.2  # labels = input_ids: a Hugging Face model shifts inside
    tags = torch.randint(0, 5, s.shape, generator=torch.Generator().manual_seed(1))
    back, forward = backward_share(s, tags)
    assert back < 0.5 and forward < 0.5
