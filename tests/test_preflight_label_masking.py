"""LABELS_MASK_REAL_TOKEN: labels masked by input_ids == pad_token_id when the pad id is the
EOS (every real end token loses its target); masking by the attention mask, and a masked
prompt, stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.label_masking import LabelMaskingCheck

EOS = 2


def rows(how: str) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(128):
        n = int(torch.randint(4, 14, (1,), generator=g))
        ids = torch.full((16,), EOS)
        ids[:n] = torch.randint(3, 50, (n,), generator=g)  # then the EOS, then padding with the EOS id
        mask = (torch.arange(16) <= n).long()
        if how == "by_pad_id":
            labels = ids.masked_fill(ids == EOS, -100)
        elif how == "by_attention":
            labels = ids.masked_fill(mask == 0, -100)
        else:  # a masked prompt of 3 tokens, padding by attention
            labels = ids.masked_fill(mask == 0, -100)
            labels[:3] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


class Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(50, 8), nn.Linear(8, 50)

    def forward(self, input_ids, attention_mask=None):
        return self.out(self.embed(input_ids))


def lm_loss(model, batch):
    logits = model(batch["input_ids"])
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), batch["labels"][:, 1:].reshape(-1))


@pytest.mark.parametrize("how, fires", [("by_pad_id", True), ("by_attention", False), ("prompt_masked", False)])
def test_labels_masked_by_a_pad_id_that_is_the_eos(how, fires):
    model = Lm()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(rows(how), batch_size=32, shuffle=True), loss_fn=lm_loss,
                           checks=[FirstBatchCheck(), LabelMaskingCheck()])
    assert bool(report.check("data.label_masking").issues) == fires
