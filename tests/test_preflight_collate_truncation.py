"""data.collate_truncation: a collate_fn that cuts every sequence to the batch's shortest
(COLLATE_TRUNCATES); padding to the longest and a fixed max_length truncation stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.collate_truncation import CollateTruncationCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck


class Reviews(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.items = [(torch.randint(1, 50, (int(torch.randint(6, 61, (1,), generator=g)),), generator=g),
                       int(torch.randint(0, 3, (1,), generator=g))) for _ in range(512)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


def collate(width_of):
    def batch(rows):
        width = width_of([len(tokens) for tokens, _ in rows])
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for k, (tokens, _) in enumerate(rows):
            ids[k, :min(len(tokens), width)] = tokens[:width]
        return ids, torch.tensor([label for _, label in rows])
    return batch


class Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(50, 16, padding_idx=0), nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


@pytest.mark.parametrize("width", ["shortest", "longest", "fixed_max_length"])
def test_a_collate_that_cuts_every_sequence_to_the_shortest(width):
    width_of = {"shortest": min, "longest": max, "fixed_max_length": lambda lengths: 8}[width]
    torch.manual_seed(0)  # the shuffled batches: the same whatever ran before in this process
    model = Bag()
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(Reviews(), batch_size=32, shuffle=True, collate_fn=collate(width_of)),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), CollateTruncationCheck()])
    found = [i for i in report.check("data.collate_truncation").issues if i.code == "COLLATE_TRUNCATES"]
    assert bool(found) == (width == "shortest")
    if found:
        assert "min(lengths)" in found[0].message and "max(lengths)" in found[0].fix
