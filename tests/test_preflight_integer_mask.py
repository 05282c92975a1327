"""step.integer_mask, INTEGER_MASK_INDEXES: y[mask] with a 0/1 integer mask gathers rows 0 and 1;
bool masks, index lists and lookups into a two-row table stay quiet."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.integer_mask import IntegerMaskCheck, integer_mask
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck


class OneGraph(Dataset):
    def __init__(self, mask_dtype: torch.dtype):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(200, 8, generator=g)
        self.y = (self.x @ torch.randn(8, 3, generator=g)).argmax(1)
        self.mask = (torch.rand(200, generator=g) < 0.6).to(mask_dtype)

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return self.x, self.y, self.mask


def node_loss(model, batch):
    x, y, mask = (part[0] for part in batch)
    return F.cross_entropy(model(x)[mask], y[mask])


@pytest.mark.parametrize("dtype", [torch.long, torch.bool], ids=["long_mask", "bool_mask"])
def test_a_train_mask_of_integers_is_named(dtype):
    model = nn.Linear(8, 3)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-2), DataLoader(OneGraph(dtype), batch_size=1),
                           loss_fn=node_loss, checks=[FirstBatchCheck(), FirstStepCheck(), IntegerMaskCheck()])
    issues = report.check("step.integer_mask").issues
    assert bool(issues) == (dtype == torch.long)
    if issues:
        assert "rows 0 and 1" in issues[0].message and "mask.bool()" in issues[0].fix


def test_what_is_no_integer_mask():
    table = torch.randn(10, 4)
    binary = torch.tensor([0, 1] * 5)
    assert integer_mask(table, binary) is not None
    assert integer_mask(torch.randn(2, 4), torch.tensor([0, 1, 1, 0])) is None  # a two-row lookup
    assert integer_mask(table, torch.tensor([0, 1, 1])) is None  # an index list, not a mask's length
    assert integer_mask(table, torch.arange(10)) is None  # a permutation
    assert integer_mask(table, binary.bool()) is None
