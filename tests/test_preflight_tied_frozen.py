"""model.tied_embeddings: TIED_WEIGHTS_FROZEN, an input embedding frozen while its weight is
also the output projection (tied) and the rest of the model trains; quiet when the tie trains
and when the whole model is frozen around adapters, however many weights they hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.tied_embeddings import TiedEmbeddingsCheck


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(40, 16)
        self.block = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        self.adapter = nn.Linear(16, 16, bias=False)
        self.wide_adapter = nn.Sequential(nn.Linear(16, 64, bias=False), nn.Linear(64, 16, bias=False))
        self.head = nn.Linear(16, 40, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(h + self.block(h) + self.adapter(h) + self.wide_adapter(h))


def lm_batches():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (64, 12), generator=g)
    return DataLoader([(row[:-1], row[1:]) for row in ids], batch_size=16)


def lm_loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]).flatten(0, 1), batch[1].flatten())


@pytest.mark.parametrize("frozen, fires", [("embedding", True), ("nothing", False), ("all_but_adapter", False),
                                           ("all_but_adapters", False)])
def test_a_frozen_embedding_that_is_also_the_output_head(frozen, fires):
    model = TiedLM()
    if frozen == "embedding":
        model.embed.weight.requires_grad_(False)
    elif frozen == "all_but_adapter":
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("adapter"))
    elif frozen == "all_but_adapters":  # adapters of a rank as wide as the model: more weights than the base
        for name, p in model.named_parameters():
            p.requires_grad_("adapter" in name)
    report = run_preflight(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], 1e-3),
                           lm_batches(), loss_fn=lm_loss, checks=[TiedEmbeddingsCheck()])
    issues = [i for i in report.check("model.tied_embeddings").issues if i.code == "TIED_WEIGHTS_FROZEN"]
    assert bool(issues) == fires
    if issues:
        assert "'embed' and 'head' share one weight" in issues[0].message and "untie first" in issues[0].fix
