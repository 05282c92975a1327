"""data.row_scaling: ROWS_NORMALIZED, a table scaled per row to unit L2 norm (sklearn's
normalize default); per-column scaling, one-hot rows, signed embeddings and wide text vectors
stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.row_scaling import RowScalingCheck, unit_rows


def invoices(scaling: str):
    g = torch.Generator().manual_seed(0)
    amounts = torch.rand(512, 8, generator=g) * torch.tensor([100, 50, 20, 10, 5, 300, 80, 40.0])
    fee = 0.01 * amounts[:, 0] + 0.03 * amounts[:, 5]
    if scaling == "rows":
        x = amounts / amounts.norm(dim=1, keepdim=True)
    else:
        x = (amounts - amounts.mean(0)) / amounts.std(0)
    return x, fee[:, None]


@pytest.mark.parametrize("scaling", ["rows", "columns"])
def test_invoice_rows_scaled_to_unit_length(scaling):
    x, y = invoices(scaling)
    model = nn.Linear(8, 1)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=nn.MSELoss(),
                           checks=[FirstBatchCheck(), RowScalingCheck()])
    found = [i for i in report.check("data.row_scaling").issues if i.code == "ROWS_NORMALIZED"]
    assert len(found) == (1 if scaling == "rows" else 0)
    if found:
        assert "StandardScaler" in found[0].fix


def test_vectors_whose_direction_is_the_point_stay_quiet():
    g = torch.Generator().manual_seed(1)
    signed = torch.nn.functional.normalize(torch.randn(64, 16, generator=g), dim=1)
    wide = torch.nn.functional.normalize(torch.rand(64, 300, generator=g), dim=1)
    one_hot = torch.nn.functional.one_hot(torch.randint(0, 6, (64,), generator=g), 6).float()
    assert not unit_rows(signed) and not unit_rows(wide) and not unit_rows(one_hot)


def customers(scaling: str) -> torch.Tensor:
    """An income in dollars beside seven ratios and counts; ``per_signal``: smooth 48-step
    signals, each z-normalised on its own (the time-series convention)."""
    g = torch.Generator().manual_seed(1)
    if scaling == "per_signal":
        x = torch.cumsum(torch.randn(256, 48, generator=g), 1)
        return (x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)
    table = torch.cat([55_000 + 15_000 * torch.randn(256, 1, generator=g), torch.rand(256, 7, generator=g) * 10], 1)
    axis = 1 if scaling == "rows" else 0
    return (table - table.mean(axis, keepdim=True)) / table.std(axis, keepdim=True)


@pytest.mark.parametrize(("scaling", "fires"), [("rows", True), ("columns", False), ("per_signal", False)])
def test_a_table_standardised_along_its_rows_fires(scaling, fires):
    x = customers(scaling)
    model = nn.Linear(x.shape[1], 2)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, torch.randint(0, 2, (len(x),))), batch_size=32, shuffle=True),
                           loss_fn=nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), RowScalingCheck()])
    found = [i for i in report.check("data.row_scaling").issues if i.code == "ROWS_STANDARDIZED"]
    assert bool(found) == fires
    if found:
        assert "axis=1" in found[0].message and "axis=0" in found[0].fix
