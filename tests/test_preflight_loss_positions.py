"""LOSS_READS_PADDING: a loss that reads one fixed column of a right-padded batch (the last
one, padding in most rows); a loss over every position, a read-out at each row's last real
token and a [CLS]-style first column stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.loss_positions import LossPositionsCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck

VOCAB = 40


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.mix, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, 16), nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask=None):
        h = self.embed(input_ids)
        return self.head(torch.tanh(self.mix(h.cumsum(1))))  # causal: position t reads tokens up to t


def rows():
    g = torch.Generator().manual_seed(0)
    out = []
    for length in torch.randint(5, 15, (96,), generator=g).tolist():
        ids, mask = torch.zeros(16, dtype=torch.long), torch.zeros(16, dtype=torch.long)
        ids[:length], mask[:length] = torch.randint(3, VOCAB, (length,), generator=g), 1
        out.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return out


def last_column(model, batch):  # a classifier's habit: one position, the batch's last
    logits = model(batch["input_ids"], batch["attention_mask"])
    return F.cross_entropy(logits[:, -2], batch["input_ids"][:, -1])


def every_position(model, batch):
    logits = model(batch["input_ids"], batch["attention_mask"])
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1))


def last_real_token(model, batch):
    logits = model(batch["input_ids"], batch["attention_mask"])
    last = batch["attention_mask"].sum(1) - 1
    return F.cross_entropy(logits[torch.arange(len(last)), last - 1], batch["input_ids"][torch.arange(len(last)), last])


def first_column(model, batch):
    return F.cross_entropy(model(batch["input_ids"])[:, 0], batch["input_ids"][:, 1])


@pytest.mark.parametrize("loss, fires", [(last_column, True), (every_position, False), (last_real_token, False),
                                         (first_column, False)])
def test_a_loss_that_reads_one_padded_column(loss, fires):
    model = TinyLM()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(rows(), batch_size=32, shuffle=True), loss_fn=loss,
                           checks=[FirstBatchCheck(), FirstStepCheck(), LossPositionsCheck()])
    found = [i for i in report.check("step.loss_positions").issues if i.code == "LOSS_READS_PADDING"]
    assert bool(found) == fires, report.check("step.loss_positions").data
    if found:
        assert "column 14 of 16" in found[0].message and "attention_mask.sum(1) - 1" in found[0].fix
