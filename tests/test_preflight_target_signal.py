"""data.target_signal: TARGETS_UNRELATED, float regression targets no neighbour average or
linear probe reads from the inputs: sin/cos of an angle in degrees (named), targets shuffled
apart from their rows; quiet on the same data done right."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.analyses.label_signal import target_signal
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.target_signal import TargetSignalCheck


def wind(n: int = 2000, radians: bool = True, shuffled: bool = False) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    degrees = 360 * torch.rand(n, generator=g)
    angle = torch.deg2rad(degrees)
    x = torch.stack([torch.cos(angle), torch.sin(angle)], 1) @ torch.randn(2, 10, generator=g)
    x = x + 0.05 * torch.randn(n, 10, generator=g)
    encoded = angle if radians else degrees  # torch.sin takes radians
    y = torch.stack([torch.sin(encoded), torch.cos(encoded)], 1)
    if shuffled:
        y = y[torch.randperm(n, generator=g)]
    return TensorDataset(x, y)


def unrelated(data: TensorDataset):
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(data, batch_size=64, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), TargetSignalCheck()])
    return [i for i in report.check("data.target_signal").issues if i.code == "TARGETS_UNRELATED"]


@pytest.mark.parametrize("radians, shuffled, fires, named", [
    (False, False, True, "degrees"), (True, True, True, "degrees"), (True, False, False, None),
], ids=["degrees_into_sin", "rows_shuffled_apart", "radians"])
def test_regression_targets_the_inputs_say_nothing_about(radians, shuffled, fires, named):
    found = unrelated(wind(radians=radians, shuffled=shuffled))
    assert bool(found) == fires
    if named:
        assert named in found[0].message and "deg2rad" in found[0].fix


def test_a_noisy_but_real_linear_relation_is_related():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1024, 20, generator=g)
    y = x[:, :3].sum(1, keepdim=True) + 3 * torch.randn(1024, 1, generator=g)  # R^2 ~ 0.25
    signal = target_signal(x, y)
    assert signal is not None and not signal.unrelated and signal.linear_r2 > 0.1


def test_soft_class_labels_are_not_regression_targets():
    from optimus_preflight.preflight.checks.target_signal import features_and_targets

    x = torch.randn(64, 10)
    mixed = torch.softmax(torch.randn(64, 4), dim=1)  # mixup / smoothed labels: rows summing to 1
    assert features_and_targets((x, mixed)) is None
    assert features_and_targets((x, torch.randn(64, 2))) is not None


@pytest.mark.parametrize("shuffled_rows", [True, False], ids=["rows_shuffled_then_windowed", "windowed_in_order"])
def test_a_series_shuffled_before_its_windows_were_cut_is_named(shuffled_rows):
    import math

    g = torch.Generator().manual_seed(3)
    t = torch.arange(3000, dtype=torch.float32)
    series = torch.sin(2 * math.pi * t / 24) + 0.5 * torch.sin(2 * math.pi * t / 168) + 0.1 * torch.randn(3000, generator=g)
    if shuffled_rows:
        series = series[torch.randperm(3000, generator=g)]
    windows = torch.stack([series[i:i + 24] for i in range(len(series) - 24)])
    model = nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 1), nn.Flatten(0))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(windows, series[24:]), batch_size=64, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), TargetSignalCheck()])
    issues = [i for i in report.check("data.target_signal").issues if i.code == "TARGETS_UNRELATED"]
    assert bool(issues) == shuffled_rows
    if issues:
        assert "shuffled before the windows were cut" in issues[0].message and "never the rows" in issues[0].fix


@pytest.mark.parametrize("per_row", [True, False], ids=["each_row_standardised", "each_feature_standardised"])
def test_rows_standardised_on_their_own_are_named_when_the_level_was_the_signal(per_row):
    # 12 meter readings of one scale; the target is the building's level, which a per-row
    # z-score erases (the columns keep their spread, so ROWS_STANDARDIZED's collapse test is quiet)
    g = torch.Generator().manual_seed(4)
    level = 1 + 4 * torch.rand(1500, 1, generator=g)
    readings = level * (1 + 0.3 * torch.randn(1500, 12, generator=g))
    y = level.squeeze(1)
    if per_row:
        x = (readings - readings.mean(1, keepdim=True)) / readings.std(1, keepdim=True)
    else:
        x = (readings - readings.mean(0)) / readings.std(0)
    found = unrelated_rows(x, y)
    assert bool(found) == per_row
    if per_row:
        assert "row.mean()" in found[0].message and "X_train.mean(0)" in found[0].fix


def unrelated_rows(x, y):
    model = nn.Sequential(nn.Linear(x.shape[1], 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True),
                           loss_fn=nn.MSELoss(), checks=[FirstBatchCheck(), TargetSignalCheck()])
    return [i for i in report.check("data.target_signal").issues if i.code == "TARGETS_UNRELATED"]


def findings_tables(label_major_view: bool, weak: bool = False) -> TensorDataset:
    """Six findings per patient, each a noisy threshold of the vitals; stacked label by label (C, N)."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1500, 12, generator=g)
    scores = x @ torch.randn(12, 6, generator=g) + (3.0 if weak else 0.5) * torch.randn(1500, 6, generator=g)
    columns = (scores > 0).float().t().contiguous()  # (C, N), one row per finding
    y = columns.view(1500, 6) if label_major_view else columns.t().contiguous()
    return TensorDataset(x, y)


@pytest.mark.parametrize("label_major_view, weak, fires", [(True, False, True), (False, False, False),
                                                           (False, True, False)],
                         ids=["view_N_C_of_C_N", "transposed", "weak_but_real_signal"])
def test_multi_label_targets_whose_rows_hold_other_samples_labels(label_major_view, weak, fires):
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 6))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(findings_tables(label_major_view, weak), batch_size=64, shuffle=True),
                           loss_fn=nn.BCEWithLogitsLoss(), checks=[FirstBatchCheck(), TargetSignalCheck()])
    found = [i for i in report.check("data.target_signal").issues if i.code == "TARGETS_UNRELATED"]
    assert bool(found) == fires, report.check("data.target_signal").data
    if fires:
        assert "multi-label" in found[0].message and ".view(N, C)" in found[0].message and ".t()" in found[0].fix


@pytest.mark.parametrize("sorted_apart", [False, True])
def test_survival_times_sorted_apart_from_their_covariates(sorted_apart):
    from tests.test_preflight_batch_order import survival_rows

    x, time, event = survival_rows(1024).tensors
    if sorted_apart:  # the times and events sorted by time, the features left in their order
        order = time.argsort()
        time, event = time[order], event[order]
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def cox(model, batch):
        inputs, times, events = batch
        order = times.argsort(descending=True)
        risk = model(inputs).squeeze(-1)[order]
        return -((risk - torch.logcumsumexp(risk, 0)) * events[order]).sum() / events.sum().clamp_min(1.0)

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, time, event), batch_size=128, shuffle=True), loss_fn=cox,
                           checks=[FirstBatchCheck(), TargetSignalCheck()])
    found = [i for i in report.check("data.target_signal").issues if i.code == "TARGETS_UNRELATED"]
    assert bool(found) == sorted_apart, report.check("data.target_signal").data
    if found:
        assert "survival" in found[0].message and "together" in found[0].fix
