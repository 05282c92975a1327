"""analyses.sample_scaling: point clouds scaled to the unit sphere or min-max scaled per axis one by
one, and series z-scored one by one, are named where the targets look unrelated to the inputs;
clouds normalised with one scale for the whole set are not."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.sample_scaling import sample_normalisation
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.target_signal import TargetSignalCheck


def clouds(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes of random size sampled as 64 points; the target is the size."""
    g = torch.Generator().manual_seed(0)
    size = 1 + 4 * torch.rand(n, 1, 1, generator=g)
    return size * (torch.rand(n, 64, 3, generator=g) - 0.5) + 3, size.flatten()


def unit_sphere(points: torch.Tensor) -> torch.Tensor:
    centred = points - points.mean(1, keepdim=True)
    return centred / centred.norm(dim=-1).amax(1)[:, None, None]


def test_the_per_sample_normalisations_are_named_and_a_global_one_is_not():
    points, _ = clouds()
    assert "unit sphere" in sample_normalisation(unit_sphere(points))
    low, high = points.amin(1, keepdim=True), points.amax(1, keepdim=True)
    assert "min-max scaled per axis" in sample_normalisation((points - low) / (high - low))
    series = torch.randn(64, 50) * 3 + 7
    assert "own mean and std" in sample_normalisation((series - series.mean(1, keepdim=True)) / series.std(1, keepdim=True))
    assert sample_normalisation((points - points.mean()) / points.std()) is None


def test_a_size_regressor_on_clouds_scaled_to_the_unit_sphere_names_the_scaling():
    points, size = clouds()
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 1), nn.Flatten(0))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(unit_sphere(points), size), batch_size=32, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), TargetSignalCheck()])
    found = [i for i in report.check("data.target_signal").issues if i.code == "TARGETS_UNRELATED"]
    assert found and "unit sphere on its own" in found[0].message and "whole training set" in found[0].fix
