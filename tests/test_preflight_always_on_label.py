"""TARGET_ALWAYS_ON: multi-hot targets built from tag lists padded with 0, so tag 0 is set
for nearly every sample; multi-hot rows built from each sample's own list stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck, TargetsCheck

TAGS = 20


def photos() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, generator=g), torch.randperm(TAGS, generator=g)[:int(torch.randint(1, 6, (1,), generator=g))])
            for _ in range(256)]


def collate(padded: bool):
    def collate_fn(rows):
        x = torch.stack([r[0] for r in rows])
        if padded:  # the padding value 0 is also tag 0
            lists = pad_sequence([r[1] for r in rows], batch_first=True, padding_value=0)
            target = torch.zeros(len(rows), TAGS).scatter_(1, lists, 1.0)
        else:
            target = torch.stack([torch.zeros(TAGS).index_fill_(0, r[1], 1.0) for r in rows])
        return x, target
    return collate_fn


@pytest.mark.parametrize("padded, fires", [(True, True), (False, False)], ids=["padded_with_tag_0", "own_lists"])
def test_a_label_set_for_nearly_every_sample(padded, fires):
    model = nn.Linear(16, TAGS)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(photos(), batch_size=64, shuffle=True, collate_fn=collate(padded)),
                           loss_fn=nn.BCEWithLogitsLoss(), checks=[FirstBatchCheck(), FirstStepCheck(), TargetsCheck()])
    issues = [i for i in report.check("step.targets").issues if i.code == "TARGET_ALWAYS_ON"]
    assert bool(issues) == fires
