"""MESHGRID_NAMES_SWAPPED: coordinate grids built once in a model's __init__ with
gx, gy = torch.meshgrid(xs, ys) (NumPy's habit under torch's 'ij' default) are named; the 'ij'
order written right, 'xy' with x first, and unnamed grids stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.meshgrid_source import swapped_grids
from optimus_preflight.preflight.checks.module_structure import ModuleStructureCheck


class SoftArgmaxNumpyHabit(nn.Module):
    def __init__(self, size: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        lin = torch.linspace(-1, 1, size)
        gx, gy = torch.meshgrid(lin, lin)
        self.register_buffer("gx", gx.reshape(-1))
        self.register_buffer("gy", gy.reshape(-1))

    def forward(self, x):
        p = self.conv(x).flatten(1).softmax(-1)
        return torch.stack([p @ self.gx, p @ self.gy], 1)


class SoftArgmaxRowsFirst(SoftArgmaxNumpyHabit):
    def __init__(self, size: int = 8):
        super().__init__(size)
        lin = torch.linspace(-1, 1, size)
        grid_y, grid_x = torch.meshgrid(lin, lin, indexing="ij")
        self.gx, self.gy = grid_x.reshape(-1), grid_y.reshape(-1)


class CoordinateChannels(nn.Module):
    def __init__(self, size: int = 8):
        super().__init__()
        lin = torch.linspace(-1, 1, size)
        xx, yy = torch.meshgrid(lin, lin, indexing="xy")
        self.register_buffer("coords", torch.stack([xx, yy]))
        self.register_buffer("stacked", torch.stack(torch.meshgrid(lin, lin)))  # unnamed: nothing to compare
        self.conv = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.cat([x, self.coords[:1].expand(len(x), 1, -1, -1)], 1)).mean((2, 3))


def swapped(model: nn.Module) -> list:
    loader = DataLoader(TensorDataset(torch.randn(32, 1, 8, 8), torch.rand(32, 2) * 2 - 1), batch_size=16)
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), loader, loss_fn=nn.MSELoss(),
                           checks=[ModuleStructureCheck()])
    return [i for i in report.check("model.structure").issues if i.code == "MESHGRID_NAMES_SWAPPED"]


def test_x_then_y_grids_from_torch_meshgrids_default_are_named():
    found = swapped(SoftArgmaxNumpyHabit())
    assert len(found) == 1 and found[0].severity.value == "warning"
    assert "gx, gy = torch.meshgrid(lin, lin)" in found[0].message and "SoftArgmaxNumpyHabit" in found[0].message
    assert "yy, xx = torch.meshgrid(ys, xs, indexing='ij')" in found[0].fix


@pytest.mark.parametrize("model", [SoftArgmaxRowsFirst, CoordinateChannels])
def test_the_order_the_indexing_gives_stays_quiet(model):
    found = [s for s in swapped_grids(model) if s.where.startswith(model.__name__)]
    assert found == []
    assert swapped(CoordinateChannels()) == []


def test_y_then_x_under_xy_indexing_is_named_too():
    def grids(size):
        lin = torch.arange(size)
        grid_y, grid_x = torch.meshgrid(lin, lin, indexing="xy")
        return grid_x, grid_y

    found = swapped_grids(grids)
    assert [(s.indexing, s.where) for s in found] == [("xy", "test_y_then_x_under_xy_indexing_is_named_too.<locals>.grids")]


class SoftArgmaxEitherOrder(nn.Module):
    """Both conventions in one class, one per branch: the grid the instance kept decides."""

    def __init__(self, numpy_order: bool, size: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, padding=1)
        lin = torch.linspace(-1, 1, size)
        if numpy_order:
            gx, gy = torch.meshgrid(lin, lin)
        else:
            gy, gx = torch.meshgrid(lin, lin, indexing="ij")
        self.register_buffer("gx", gx.reshape(-1))
        self.register_buffer("gy", gy.reshape(-1))

    def forward(self, x):
        p = self.conv(x).flatten(1).softmax(-1)
        return torch.stack([p @ self.gx, p @ self.gy], 1)


@pytest.mark.parametrize("numpy_order", [True, False])
def test_a_class_with_both_orders_is_judged_by_the_grid_its_instance_kept(numpy_order):
    found = swapped(SoftArgmaxEitherOrder(numpy_order))
    assert len(found) == (1 if numpy_order else 0)
