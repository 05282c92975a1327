"""ATTENTION_OVER_HEADS: queries split into heads with view(B, T, heads, d) and handed to
scaled_dot_product_attention without transpose(1, 2); the transposed split stays quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.batch_layout import BatchLayoutCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck


class TinyLM(nn.Module):
    def __init__(self, transpose: bool, heads: int = 4, d: int = 32):
        super().__init__()
        torch.manual_seed(0)
        self.transpose, self.heads = transpose, heads
        self.embed, self.qkv, self.out = nn.Embedding(40, d), nn.Linear(d, 3 * d), nn.Linear(d, 40)

    def forward(self, ids):
        B, T = ids.shape
        q, k, v = (t.view(B, T, self.heads, -1) for t in self.qkv(self.embed(ids)).chunk(3, dim=-1))
        if self.transpose:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2) if self.transpose else y
        return self.out(y.reshape(B, T, -1))


def lm_loss(model, batch):
    ids = batch[0]
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, 40), ids[:, 1:].reshape(-1))


@pytest.mark.parametrize("transpose", [False, True], ids=["heads_not_transposed", "heads_transposed"])
def test_attention_across_the_heads_of_one_position(transpose):
    ids = torch.randint(0, 40, (256, 17), generator=torch.Generator().manual_seed(0))
    model = TinyLM(transpose)
    report = run_preflight(model, torch.optim.AdamW(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(ids), batch_size=32, shuffle=True), loss_fn=lm_loss,
                           checks=[FirstBatchCheck(), BatchLayoutCheck()])
    issues = [i for i in report.check("step.batch_layout").issues if i.code == "ATTENTION_OVER_HEADS"]
    assert bool(issues) == (not transpose)
    if issues:
        assert "transpose(1, 2)" in issues[0].fix
