"""data.coded_columns: label-encoded categories fed to the first layer as one float column
(CATEGORY_CODES_AS_NUMBERS), for class labels and regression targets, raw or standardised codes;
an ordered integer column (an age), counts, one-hot columns and continuous features stay quiet."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.coded_columns import coded_columns
from optimus_preflight.preflight.checks.coded_columns import CodedColumnsCheck
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from tests.preflight_support import assert_quiet


def customers(effect_of_level, levels: int = 40, rows: int = 2000, standardise: bool = False):
    g = torch.Generator().manual_seed(3)
    numeric, level = torch.randn(rows, 4, generator=g), torch.randint(0, levels, (rows,), generator=g)
    score = effect_of_level(levels, g)[level] + numeric[:, 0]
    column = level.float()
    if standardise:
        column = (column - column.mean()) / column.std()
    return torch.cat([numeric, column[:, None]], 1), score


def run(x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module):
    model = nn.Sequential(nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, 2 if y.dtype == torch.long else 1))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True), loss_fn=loss_fn,
                           checks=[FirstBatchCheck(), CodedColumnsCheck()])
    return report.check("data.coded_columns")


def random_effects(levels, g):
    return 1.5 * torch.randn(levels, generator=g)


def smooth_effects(levels, g):
    return torch.linspace(-2, 2, levels)


@pytest.mark.parametrize("standardise", [False, True], ids=["raw_codes", "standardised_codes"])
def test_city_codes_as_a_float_column_fire_for_classes(standardise):
    x, score = customers(random_effects, standardise=standardise)
    result = run(x, (score > 0).long(), nn.CrossEntropyLoss())
    issues = [i for i in result.issues if i.code == "CATEGORY_CODES_AS_NUMBERS"]
    assert issues, result.data
    assert "column(s) 4 (40 levels)" in issues[0].message and "nn.Embedding(levels, dim)" in issues[0].fix


def test_codes_fire_for_a_regression_target():
    x, score = customers(random_effects)
    result = run(x, score[:, None], nn.MSELoss())
    assert [i for i in result.issues if i.code == "CATEGORY_CODES_AS_NUMBERS"], result.data


def test_an_ordered_integer_column_and_continuous_features_stay_quiet():
    x, score = customers(smooth_effects)
    result = run(x, (score > 0).long(), nn.CrossEntropyLoss())
    assert_quiet(result)
    assert result.data["coded_columns"] == []


def test_counts_and_one_hot_columns_are_not_codes():
    g = torch.Generator().manual_seed(1)
    counts = torch.poisson(torch.full((2000,), 4.0), generator=g)
    one_hot = torch.nn.functional.one_hot(torch.randint(0, 5, (2000,), generator=g), 5).float()
    target = counts * 0.5 + one_hot @ torch.tensor([2.0, -1.0, 0.5, -2.0, 1.0]) + 0.3 * torch.randn(2000, generator=g)
    assert coded_columns(torch.cat([counts[:, None], one_hot], 1), target) == []


def test_a_cyclic_hour_encoding_is_not_a_code():
    """cos(hour) sorts hour h next to 24 - h: rough by value order, but not on a grid of codes."""
    import math

    g = torch.Generator().manual_seed(2)
    hour = torch.randint(0, 24, (2000,), generator=g)
    angle = 2 * math.pi * hour.float() / 24
    target = torch.sin(angle) * 2 + 0.2 * torch.randn(2000, generator=g)
    assert coded_columns(torch.stack([angle.sin(), angle.cos()], 1), target) == []
    assert coded_columns(hour.float()[:, None], torch.randn(24, generator=g)[hour] * 2) != []
