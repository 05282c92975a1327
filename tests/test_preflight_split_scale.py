"""VAL_INPUTS_OTHER_SCALE / VAL_TARGETS_OTHER_SCALE: a scaler fitted and applied to the training
split only, and targets log-transformed for training only; the same preprocessing on both
splits, a chronological split of a drifting series and noise augmentation on the training
split alone stay quiet, and the label-mapping check does not read a scale mismatch as
relabelled classes."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.split_labels import SplitLabelsCheck
from optimus_preflight.preflight.checks.split_scale import SplitScaleCheck, scale_mismatch
from tests.preflight_support import assert_quiet, codes

NAME = "data.split_scale"


def raw_table(rows: int = 1500, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns on raw scales (hundreds, a few, thousands) and class labels from them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=g) * torch.tensor([50.0, 2.0, 800.0, 10.0, 0.3, 120.0]) \
        + torch.tensor([200.0, 5.0, 3000.0, 40.0, 1.0, 500.0])
    labels = ((x[:, 0] - 200) / 50 + (x[:, 2] - 3000) / 800 > 0).long() + ((x[:, 3] - 40) / 10 > 0.5).long()
    return x, labels


def preflight(train: TensorDataset, val: TensorDataset, model: nn.Module, loss_fn):
    return run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3), DataLoader(train, batch_size=32, shuffle=True),
                         val_loader=DataLoader(val, batch_size=64), loss_fn=loss_fn,
                         checks=[FirstBatchCheck(), SplitScaleCheck(), SplitLabelsCheck()])


def test_a_scaler_applied_to_the_training_split_only_fires():
    x, y = raw_table()
    mean, std = x[:1200].mean(0), x[:1200].std(0)
    train = TensorDataset((x[:1200] - mean) / std, y[:1200])
    report = preflight(train, TensorDataset(x[1200:], y[1200:]), nn.Linear(6, 3), nn.CrossEntropyLoss())
    result = report.check(NAME)
    assert codes(result) == {"VAL_INPUTS_OTHER_SCALE"}
    assert "4 of the 6 columns" in result.issues[0].message  # std 2 and 0.3: within SPREAD of 1 and "scaler.transform" in result.issues[0].fix
    assert "VAL_LABEL_MAPPING" not in codes(report.check("data.split_labels"))
    healthy = preflight(train, TensorDataset((x[1200:] - mean) / std, y[1200:]), nn.Linear(6, 3), nn.CrossEntropyLoss())
    assert_quiet(healthy.check(NAME))


def test_targets_log_transformed_for_training_only_fire():
    x, _ = raw_table()
    prices = (x[:, 0] * 3 + x[:, 2]).unsqueeze(1)
    standardised = (x - x[:1200].mean(0)) / x[:1200].std(0)
    train = TensorDataset(standardised[:1200], torch.log1p(prices[:1200]))
    result = preflight(train, TensorDataset(standardised[1200:], prices[1200:]), nn.Linear(6, 1), nn.MSELoss()).check(NAME)
    assert codes(result) == {"VAL_TARGETS_OTHER_SCALE"} and "log1p" in result.issues[0].fix
    logged = TensorDataset(standardised[1200:], torch.log1p(prices[1200:]))
    assert_quiet(preflight(train, logged, nn.Linear(6, 1), nn.MSELoss()).check(NAME))


def test_a_chronological_split_of_a_drifting_series_and_training_noise_are_quiet():
    walk = torch.cumsum(torch.randn(4000, generator=torch.Generator().manual_seed(1)), 0)
    windows = torch.stack([walk[i : i + 16] for i in range(3900)])
    targets = walk[16:3916].unsqueeze(1)
    train, val = TensorDataset(windows[:3000], targets[:3000]), TensorDataset(windows[3000:], targets[3000:])
    assert_quiet(preflight(train, val, nn.Linear(16, 1), nn.MSELoss()).check(NAME))
    x, y = raw_table()
    x = (x - x.mean(0)) / x.std(0)
    noisy = TensorDataset(x[:1200] + 0.5 * torch.randn(1200, 6, generator=torch.Generator().manual_seed(2)), y[:1200])
    assert_quiet(preflight(noisy, TensorDataset(x[1200:], y[1200:]), nn.Linear(6, 3), nn.CrossEntropyLoss()).check(NAME))


def test_scale_mismatch_needs_most_varying_columns_off():
    g = torch.Generator().manual_seed(3)
    train = torch.randn(200, 4, generator=g)
    assert scale_mismatch(train, torch.randn(100, 4, generator=g)) is None
    one_off = torch.randn(100, 4, generator=g)
    one_off[:, 0] *= 100
    assert scale_mismatch(train, one_off) is None  # one column of four: a shift, not a pipeline
    scaled = torch.randn(100, 4, generator=g) * 50
    found = scale_mismatch(train, scaled)
    assert found is not None and found.off == [0, 1, 2, 3] and found.columns == 4


def test_validation_columns_in_another_order_are_named_as_reordered():
    x, y = raw_table()
    order = [2, 0, 1, 5, 3, 4]  # a column list built from a set, or listed differently for validation
    report = preflight(TensorDataset(x[:1200], y[:1200]), TensorDataset(x[1200:][:, order], y[1200:]),
                       nn.Linear(6, 3), nn.CrossEntropyLoss())
    result = report.check(NAME)
    assert codes(result) == {"VAL_COLUMNS_REORDERED"}
    assert "0 <- 2" in result.issues[0].message and "df_val[df_train.columns]" in result.issues[0].fix


def test_training_targets_cast_to_long_beside_float_validation_targets_fire():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1500, 8, generator=g)
    ratings = 2.5 + 2.4 * torch.tanh(x @ torch.randn(8, generator=g) / 3)  # continuous, in (0.1, 4.9)
    model = nn.Linear(8, 1)

    def mse(model, batch):
        return nn.functional.mse_loss(model(batch[0]).squeeze(-1), batch[1].float())

    report = preflight(TensorDataset(x[:1200], ratings[:1200].long()), TensorDataset(x[1200:], ratings[1200:]), model, mse)
    result = report.check(NAME)
    assert "TARGETS_CAST_TO_INT" in codes(result)
    issue = next(i for i in result.issues if i.code == "TARGETS_CAST_TO_INT")
    assert "int64" in issue.message and "dtype=torch.float32" in issue.fix
    kept_float = preflight(TensorDataset(x[:1200], ratings[:1200]), TensorDataset(x[1200:], ratings[1200:]), model, mse)
    assert "TARGETS_CAST_TO_INT" not in codes(kept_float.check(NAME))
    classes = preflight(TensorDataset(x[:1200], ratings[:1200].long()), TensorDataset(x[1200:], ratings[1200:].long()),
                        nn.Linear(8, 5), nn.CrossEntropyLoss())
    assert "TARGETS_CAST_TO_INT" not in codes(classes.check(NAME))


def test_validation_inputs_standardised_on_themselves_fire():
    x, y = raw_table()
    newer = x[1200:] * 1.3 + 40  # a newer site: larger values
    train_mean, train_std = x[:1200].mean(0), x[:1200].std(0)
    train = TensorDataset((x[:1200] - train_mean) / train_std, y[:1200])
    own = TensorDataset((newer - newer.mean(0)) / newer.std(0), y[1200:])  # fit_transform on validation
    report = preflight(train, own, nn.Linear(6, 3), nn.CrossEntropyLoss())
    result = report.check(NAME)
    assert codes(result) == {"VAL_SCALER_REFIT"}
    assert "all 300 validation samples" in result.issues[0].message and "scaler.transform(X_val)" in result.issues[0].fix
    with_training_scaler = TensorDataset((newer - train_mean) / train_std, y[1200:])
    report = preflight(train, with_training_scaler, nn.Linear(6, 3), nn.CrossEntropyLoss())
    assert "VAL_SCALER_REFIT" not in codes(report.check(NAME))
    same_site = TensorDataset((x[1200:] - train_mean) / train_std, y[1200:])
    assert_quiet(preflight(train, same_site, nn.Linear(6, 3), nn.CrossEntropyLoss()).check(NAME))


def test_float_training_inputs_beside_token_validation_inputs_do_not_crash():
    x, y = raw_table()
    tokens = TensorDataset(torch.randint(0, 50, (300, 6)), y[1200:])
    report = preflight(TensorDataset(x[:1200], y[:1200]), tokens, nn.Linear(6, 3), nn.CrossEntropyLoss())
    assert report.check(NAME).status.value != "crashed", report.check(NAME).detail


def sensor_windows(leak: bool, rows: int, seed: int) -> TensorDataset:
    """24-step windows and the next value; ``leak``: each window z-scored together with its target."""
    g = torch.Generator().manual_seed(seed)
    level = torch.randn(rows, 1, generator=g) * 3
    series = level + torch.cumsum(0.3 * torch.randn(rows, 25, generator=g), 1)
    if leak:
        series = (series - series.mean(1, keepdim=True)) / series.std(1, keepdim=True)
        return TensorDataset(series[:, :24].contiguous(), series[:, 24].contiguous())
    mean, std = series[:, :24].mean(1, keepdim=True), series[:, :24].std(1, keepdim=True)
    return TensorDataset(((series[:, :24] - mean) / std).contiguous(), ((series[:, 24:] - mean) / std)[:, 0].contiguous())


def forecaster_issues(train: TensorDataset, val: TensorDataset) -> set[str]:
    model = nn.Sequential(nn.Linear(24, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))
    return codes(preflight(train, val, model, nn.MSELoss()).check("data.split_scale"))


def test_training_windows_normalised_with_their_target_fire():
    assert "TRAIN_TARGET_IN_INPUTS" in forecaster_issues(sensor_windows(True, 1200, 0), sensor_windows(False, 300, 1))


def test_windows_normalised_by_their_inputs_and_an_exact_relation_in_both_splits_are_quiet():
    assert "TRAIN_TARGET_IN_INPUTS" not in forecaster_issues(sensor_windows(False, 1200, 0), sensor_windows(False, 300, 1))
    # a noise-free synthetic target holds in validation too: a relation, not a leak
    g = torch.Generator().manual_seed(2)
    x, weights = torch.randn(1500, 24, generator=g), torch.randn(24, generator=g)
    both = TensorDataset(x, x @ weights)
    assert "TRAIN_TARGET_IN_INPUTS" not in forecaster_issues(TensorDataset(*both[:1200]), TensorDataset(*both[1200:]))


def speech_batches(rows: int, seed: int, scale: float, offset: float) -> TensorDataset:
    """(features (N, T, F), transcripts, input lengths, target lengths): CTC's four tensors."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(rows, 20, 8, generator=g) * scale + offset
    return TensorDataset(feats, torch.randint(1, 6, (rows, 4), generator=g), torch.full((rows,), 20),
                         torch.full((rows,), 4))


def test_speech_features_standardised_for_training_only_fire_in_four_tensor_batches():
    model = nn.Linear(8, 6)

    def ctc(m, batch):
        feats, targets, input_lengths, target_lengths = batch
        return nn.functional.ctc_loss(m(feats).log_softmax(-1).transpose(0, 1), targets, input_lengths, target_lengths)

    train = speech_batches(600, 0, 1.0, 0.0)
    result = preflight(train, speech_batches(200, 1, 6.0, 6.0), model, ctc).check(NAME)
    assert codes(result) == {"VAL_INPUTS_OTHER_SCALE"} and "training split only" in result.issues[0].message
    assert_quiet(preflight(train, speech_batches(200, 1, 1.0, 0.0), model, ctc).check(NAME))


def test_a_pinn_trained_on_the_forcing_and_validated_on_the_solution_is_a_note():
    """-u'' = f on [0, 1]: collocation points with the forcing for training, points with the exact
    solution u = sin(pi x) for validation. Different quantities by design, no unit between them."""
    x = torch.rand(512, 1, generator=torch.Generator().manual_seed(0))
    xv = torch.linspace(0, 1, 201)[:, None]
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))

    def residual(m, batch):
        points, forcing = batch
        points = points.clone().requires_grad_(True)
        du = torch.autograd.grad(m(points).sum(), points, create_graph=True)[0]
        u_xx = torch.autograd.grad(du.sum(), points, create_graph=True)[0]
        return ((-u_xx - forcing) ** 2).mean()

    result = preflight(TensorDataset(x, -torch.pi ** 2 * torch.sin(torch.pi * x) * 3 - 4),
                       TensorDataset(xv, torch.sin(torch.pi * xv)), model, residual).check(NAME)
    assert [(i.code, i.severity.value) for i in result.issues] == [("VAL_TARGETS_OTHER_SCALE", "info")]
    assert "different quantities" in result.issues[0].message


def test_unit_change_reads_rescaling_logs_and_standardisation():
    from optimus_preflight.preflight.checks.split_scale import unit_change

    assert unit_change(3.6, 0.9, 3600.0, 900.0)  # millimetres against metres
    assert unit_change(8.19, 0.25, 3600.0, 900.0)  # log1p on one side
    assert unit_change(0.02, 1.3, 3600.0, 900.0)  # standardised on one side
    assert not unit_change(-6.78, 5.29, 0.707, 0.541)  # a forcing against a solution


def pinn_on(points: torch.Tensor):
    """A Poisson PINN's collocation points (x,) for training, an analytic solution on [-1, 1] to score."""
    grid = torch.linspace(-1, 1, 201).unsqueeze(1)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))

    def residual(m, batch):
        x = batch[0].clone().requires_grad_(True)
        (u_x,) = torch.autograd.grad(m(x).sum(), x, create_graph=True)
        (u_xx,) = torch.autograd.grad(u_x.sum(), x, create_graph=True)
        return (u_xx + torch.pi ** 2 * torch.sin(torch.pi * x)).pow(2).mean()

    return run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                         DataLoader(TensorDataset(points), batch_size=64, shuffle=True),
                         val_loader=DataLoader(TensorDataset(grid, torch.sin(torch.pi * grid)), batch_size=201),
                         loss_fn=residual, checks=[FirstBatchCheck(), SplitScaleCheck()])


def test_collocation_points_drawn_over_half_the_domain_leave_validation_uncovered():
    g = torch.Generator().manual_seed(0)
    half = pinn_on(torch.rand(1024, 1, generator=g)).check("data.split_scale")
    assert codes(half) == {"VAL_OUTSIDE_TRAIN_RANGE"}
    assert "torch.rand(n, 1) * 2 - 1" in half.issues[0].fix and "span [-1, 1]" in half.issues[0].message
    whole = pinn_on(torch.rand(1024, 1, generator=g) * 2 - 1).check("data.split_scale")
    assert_quiet(whole)
