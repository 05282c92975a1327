"""data.input_scale (DP12, DP10): image inputs on the wrong scale, as transforms really
produce them, fire; images scaled and normalised once, uint8 converted by the model,
token ids and tabular features stay quiet.

The broken inputs are built the way torchvision makes them (checked against
torchvision 0.29's transforms on torch 2.13): ToTensor() on a float array returns
0..255 unscaled, Normalize after it gives values up to ~1100, Normalize twice gives a
per-channel std ~ 1/std.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight import run_preflight
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.input_scale import (
    ChannelStats,
    InputScaleCheck,
    image_like,
    scale_finding,
)
from optimus_preflight.preflight.framework import CheckStatus
from tests.preflight_support import CLASSES, assert_quiet, codes, make_recipe, plain_context, run

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
NAME = "data.input_scale"


def pixels(samples: int = 32, side: int = 16) -> torch.Tensor:
    """Natural-looking images in [0, 1] (smooth, per-channel std ~0.25), NCHW."""
    generator = torch.Generator().manual_seed(0)
    coarse = torch.rand(samples, 3, 6, 6, generator=generator)
    return F.interpolate(coarse, size=side, mode="bilinear", align_corners=False).clamp(0, 1)


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images - MEAN) / STD


def labels(samples: int = 32) -> torch.Tensor:
    return torch.randint(0, CLASSES, (samples,), generator=torch.Generator().manual_seed(1))


def cnn(channels: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, CLASSES))


class Uint8CNN(nn.Module):
    """Takes uint8 HWC images, as a dataset that skips ToTensor hands them over."""

    def __init__(self, scale: bool = True):
        super().__init__()
        self.scale = scale
        self.body = cnn()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float()
        return self.body(x / 255 if self.scale else x)


def check_on(tmp_path, images: torch.Tensor, model=cnn):
    ctx = plain_context(tmp_path, model=model, dataset=TensorDataset(images, labels(len(images))))
    return run(ctx, InputScaleCheck)[NAME]


# ---------------------------------------------------------------- healthy: quiet
def test_images_normalised_once_are_quiet(tmp_path):
    result = check_on(tmp_path, normalise(pixels()))
    assert_quiet(result)
    assert result.data["layer"] == "0"  # the first conv, read through one cut-short forward
    assert all(0.5 < channel["std"] < 2 for channel in result.data["channels"])


def test_images_in_zero_one_are_quiet(tmp_path):
    assert_quiet(check_on(tmp_path, pixels()))


def test_uint8_images_the_model_scales_are_quiet(tmp_path):
    raw = (pixels() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
    result = check_on(tmp_path, raw, model=Uint8CNN)
    assert_quiet(result)
    assert result.data["channels"][0]["max"] <= 1.0


def test_a_batchnorm_in_front_of_the_first_conv_normalises_unscaled_pixels(tmp_path):
    def model():
        return nn.Sequential(nn.BatchNorm2d(3), *cnn())

    ctx = plain_context(tmp_path, model=model, dataset=TensorDataset(pixels() * 255, labels()))
    before = {key: value.clone() for key, value in ctx.model.state_dict().items()}
    result = run(ctx, InputScaleCheck)[NAME]
    assert_quiet(result)
    # The forward ran in train mode (BatchNorm updated its running stats) and was undone.
    after = ctx.model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)


class TimeConditioned(nn.Module):
    """Reads a raw diffusion timestep (0..1000) through a Linear before the image."""

    def __init__(self):
        super().__init__()
        self.time = nn.Linear(1, CLASSES)
        self.body = cnn()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        timestep = torch.full((images.shape[0], 1), 500.0)
        return self.body(images) + self.time(timestep)


def test_a_conditioning_input_read_before_the_image_is_not_taken_for_it(tmp_path):
    result = check_on(tmp_path, normalise(pixels()), model=TimeConditioned)
    assert_quiet(result)
    assert result.data["layer"] == "body.0"


def test_token_ids_run_no_forward_and_standardised_features_are_quiet(tmp_path):
    lm = run(make_recipe(tmp_path / "lm", classification=False), InputScaleCheck)[NAME]
    assert_quiet(lm)
    assert lm.data["summary"] == "no image-like or tabular input in the first batch"
    tabular = run(make_recipe(tmp_path / "mlp"), InputScaleCheck)[NAME]
    assert_quiet(tabular)
    assert tabular.data["raw_columns"] == []


def customers(samples: int = 64) -> torch.Tensor:
    """A customer table as read from the CSV: age, income in dollars, signup year, and
    three standardised scores."""
    g = torch.Generator().manual_seed(0)
    age = 20 + 50 * torch.rand(samples, generator=g)
    income = 50_000 + 20_000 * torch.randn(samples, generator=g)
    year = torch.randint(1995, 2024, (samples,), generator=g).float()
    return torch.cat([torch.stack([age, income, year], dim=1), torch.randn(samples, 3, generator=g)], dim=1)


def tabular_mlp(norm_first: bool = False):
    def build():
        layers = [nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, CLASSES)]
        return nn.Sequential(*([nn.BatchNorm1d(6)] if norm_first else []), *layers)
    return build


def test_tabular_features_on_raw_scales_fire_dp12_naming_the_columns(tmp_path):
    result = check_on(tmp_path, customers(), model=tabular_mlp())
    assert codes(result) == {"DP12"}
    message, fix = result.issues[0].message, result.issues[0].fix
    assert "receives 2 of its 6 feature columns on raw scales" in message and "column(s) 1 (mean" in message
    assert "x_train.mean(0)" in fix
    # Both fixes it prints work: standardised columns, or a BatchNorm1d in front.
    table = customers()
    standardised = (table - table.mean(0)) / table.std(0)
    assert_quiet(check_on(tmp_path, standardised, model=tabular_mlp()))
    assert_quiet(check_on(tmp_path, customers(), model=tabular_mlp(norm_first=True)))


def test_columns_squeezed_by_the_whole_tables_min_max_fire_dp12(tmp_path):
    # An account number beside five behavioural columns, min-max scaled with X.min() and
    # X.max() of the whole table instead of per column.
    g = torch.Generator().manual_seed(2)
    table = torch.cat([torch.randint(10_000_000, 99_999_999, (64, 1), generator=g).float(),
                       torch.randn(64, 5, generator=g)], dim=1)
    squeezed = (table - table.min()) / (table.max() - table.min())
    result = check_on(tmp_path, squeezed, model=tabular_mlp())
    assert codes(result) == {"DP12"} and result.data["signature"] == "features_squeezed"
    assert "5 of its 6 feature columns squeezed" in result.issues[0].message and "X.min(0)" in result.issues[0].fix
    per_column = (table - table.min(0).values) / (table.max(0).values - table.min(0).values)
    assert_quiet(check_on(tmp_path, per_column, model=tabular_mlp()))


def test_counts_and_one_hot_columns_are_quiet(tmp_path):
    g = torch.Generator().manual_seed(1)
    counts = torch.poisson(torch.full((64, 3), 6.0), generator=g)
    one_hot = F.one_hot(torch.randint(0, 3, (64,), generator=g), 3).float()
    assert_quiet(check_on(tmp_path, torch.cat([counts, one_hot], dim=1), model=tabular_mlp()))


def test_what_counts_as_an_image():
    assert image_like(torch.rand(2, 3, 16, 16))
    assert image_like(torch.zeros(2, 16, 16, 3, dtype=torch.uint8))
    assert image_like(torch.randint(0, 256, (2, 28, 28)).float())  # MNIST as floats
    assert not image_like(torch.randint(0, 100, (2, 64)))  # token ids
    assert not image_like(torch.randn(2, 8))  # tabular
    assert not image_like(torch.rand(2, 64, 32) * 10)  # a batch of feature sequences
    assert not image_like(torch.rand(2, 64, 16, 16))  # feature maps, not images


# ------------------------------------------------------------------ broken: fire
def test_float_pixels_that_totensor_left_in_0_255_fire_dp12(tmp_path):
    # ToTensor() on a float32 HWC array: the same values, transposed, not divided by 255.
    result = check_on(tmp_path, (pixels() * 255).round())
    assert codes(result) == {"DP12"} and result.status == CheckStatus.WARNING
    issue = result.issues[0]
    assert "0..255" in issue.message and "ToTensor" in issue.message
    assert "/ 255" in issue.fix and issue.config_key == "data.train"
    assert result.data["signature"] == "unscaled"


def test_sixteen_bit_pixels_fire_dp12_naming_their_range(tmp_path):
    result = check_on(tmp_path, (pixels() * 65535).round())
    assert codes(result) == {"DP12"}
    assert "65535" in result.issues[0].message


def test_normalize_applied_to_0_255_pixels_fires_dp12(tmp_path):
    result = check_on(tmp_path, normalise(pixels() * 255))
    assert codes(result) == {"DP12"}
    assert result.data["signature"] == "normalised_unscaled"
    assert "before Normalize" in result.issues[0].fix


def test_uint8_converted_in_the_model_without_dividing_fires_dp12_with_a_model_fix(tmp_path):
    raw = (pixels() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
    result = check_on(tmp_path, raw, model=lambda: Uint8CNN(scale=False))
    assert codes(result) == {"DP12"}
    issue = result.issues[0]
    assert "uint8" in issue.message and "x.float() / 255" in issue.fix
    assert issue.config_key is None  # the model's code, not the dataset's


def test_pixels_divided_by_255_twice_fire_dp12(tmp_path):
    result = check_on(tmp_path, pixels() / 255)
    assert codes(result) == {"DP12"} and result.data["signature"] == "scaled_twice"


def test_normalize_applied_twice_fires_dp10(tmp_path):
    result = check_on(tmp_path, normalise(normalise(pixels())))
    assert codes(result) == {"DP10"} and result.data["signature"] == "normalised_twice"
    assert "twice" in result.issues[0].message


def test_normalize_with_0_255_statistics_on_scaled_pixels_fires_dp10(tmp_path):
    mean = torch.tensor([125.3, 123.0, 113.9]).view(1, 3, 1, 1)
    std = torch.tensor([63.0, 62.1, 66.7]).view(1, 3, 1, 1)
    result = check_on(tmp_path, (pixels() - mean) / std)
    assert codes(result) == {"DP10"} and result.data["signature"] == "wrong_statistics"
    assert "divide that mean and std by 255" in result.issues[0].fix


def test_mnist_as_unscaled_floats_into_an_mlp_fires_dp12(tmp_path):
    images = (pixels()[:, 0] * 255).round()  # (N, 16, 16), as torch.tensor(x_train) gives

    def mlp():
        return nn.Sequential(nn.Flatten(), nn.Linear(256, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    result = check_on(tmp_path, images, model=mlp)
    assert codes(result) == {"DP12"} and "Linear" in result.issues[0].message


def test_one_unscaled_channel_is_named(tmp_path):
    images = normalise(pixels())
    depth = (pixels()[:, :1] * 255).round()
    result = check_on(tmp_path, torch.cat([images, depth], dim=1), model=lambda: cnn(4))
    assert codes(result) == {"DP12"} and "channel(s) 3" in result.issues[0].message


def spectrograms(samples: int = 32, log: bool = False) -> torch.Tensor:
    """(B, 1, F, T) power spectrograms of a tone over noise: 660x between the loudest bin and the
    median, as torch.stft(...).abs() ** 2 gives them."""
    g = torch.Generator().manual_seed(0)
    t = torch.arange(4000) / 8000
    tones = 300 + 500 * torch.randint(0, 2, (samples, 1), generator=g)
    waves = torch.sin(2 * torch.pi * tones * t) + 0.3 * torch.randn(samples, 4000, generator=g)
    power = torch.stft(waves, 256, 128, window=torch.hann_window(256), return_complex=True).abs() ** 2 * 1000
    return (power.clamp_min(1e-6).log() if log else power).unsqueeze(1).float()


def test_a_power_spectrogram_without_a_log_fires_dp12_naming_the_log(tmp_path):
    result = check_on(tmp_path, spectrograms(), model=lambda: cnn(1))
    assert codes(result) == {"DP12"}
    assert "spectrogram" in result.issues[0].message and "AmplitudeToDB" in result.issues[0].fix
    assert_quiet(check_on(tmp_path, spectrograms(log=True), model=lambda: cnn(1)))


def test_sparse_counts_and_depth_maps_are_not_heavy_tailed():
    def stats(median, high):
        return [ChannelStats(high / 4, high / 5, 0.0, high, False, median)]

    for median, high in ((2.0, 20.0), (20.0, 80.0)):  # event counts, a depth map in metres
        found = scale_finding(stats(median, high))
        assert found is None or found.kind != "heavy_tailed"
    assert scale_finding(stats(6000.0, 4e6)).kind == "heavy_tailed"


def test_signatures_from_statistics():
    def stats(mean, std, low, high, channels=3):
        return [ChannelStats(mean, std, low, high)] * channels

    assert scale_finding(stats(0.0, 1.0, -2.1, 2.6)) is None  # normalised once
    assert scale_finding(stats(0.45, 0.25, 0.0, 1.0)) is None  # [0, 1]
    assert scale_finding(stats(0.0, 2.1, -2.1, 2.3)) is None  # black-and-white, normalised once
    assert scale_finding(stats(0.0, 0.0, 0.0, 0.0)) is None  # an all-zero batch says nothing
    assert scale_finding(stats(110.0, 60.0, 0.0, 255.0)).kind == "unscaled"
    assert scale_finding(stats(500.0, 300.0, -2.1, 1100.0)).kind == "normalised_unscaled"
    assert scale_finding(stats(-2.0, 4.4, -11.0, 8.0)).kind == "normalised_twice"
    assert scale_finding(stats(0.0018, 0.001, 0.0, 0.0039)).kind == "scaled_twice"
    assert scale_finding(stats(-1.98, 0.004, -1.99, -1.97)).kind == "wrong_statistics"


def test_a_plain_loop_gets_the_fix_for_its_own_code():
    images = (pixels() * 255).round()
    loader = DataLoader(TensorDataset(images, labels()), batch_size=16, shuffle=True)
    model = cnn()
    report = run_preflight(model, torch.optim.SGD(model.parameters(), lr=0.1), loader, loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), InputScaleCheck()])
    result = next(r for r in report.checks if r.name == NAME)
    issue = result.issues[0]
    assert issue.code == "DP12" and issue.config_key is None
    assert "the DataLoader you train with" in issue.fix


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_offset_columns_rounded_away_under_bf16_autocast(precision):
    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
    from optimus_preflight.preflight.checks.input_scale import InputScaleCheck

    g = torch.Generator().manual_seed(0)
    pressure = 1013 + 1.5 * torch.randn(512, 6, generator=g)  # hPa: an offset of 1013, a spread of 1.5
    labels = (pressure[:, 0] > 1013).long()
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           torch.utils.data.DataLoader(torch.utils.data.TensorDataset(pressure, labels), batch_size=64),
                           loss_fn=torch.nn.CrossEntropyLoss(), precision=precision,
                           checks=[FirstBatchCheck(), InputScaleCheck()])
    issues = [i for i in report.check("data.input_scale").issues if i.code == "DP12"]
    assert len(issues) == 1  # raw scales either way
    assert ("rounded away" in issues[0].message) == (precision == "bf16")


@pytest.mark.parametrize("fill", ["sentinel", "median", "one_hot"])
def test_a_missing_value_sentinel_that_sets_the_column_statistics(fill):
    from optimus_preflight.preflight import run_preflight
    from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
    from optimus_preflight.preflight.checks.input_scale import InputScaleCheck

    g = torch.Generator().manual_seed(0)
    income = torch.randn(1024, 4, generator=g)
    missing = torch.rand(1024, 4, generator=g) < 0.1
    if fill == "one_hot":
        income[:, 3] = (torch.rand(1024, generator=g) < 0.3).float()  # a 0/1 flag column is no sentinel
        missing[:, 3] = False
    income[missing] = -999.0 if fill == "sentinel" else 0.0
    income = (income - income.mean(0)) / income.std(0)
    labels = (income[:, 0] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           torch.utils.data.DataLoader(torch.utils.data.TensorDataset(income, labels), batch_size=256),
                           loss_fn=torch.nn.CrossEntropyLoss(), checks=[FirstBatchCheck(), InputScaleCheck()])
    sentinel = [i for i in report.check("data.input_scale").issues if "sentinel" in i.message]
    assert bool(sentinel) == (fill == "sentinel")


# ---------------------------------------------------------------- CHANNELS_INTERLEAVED

def _smooth_rgb(n: int = 128, side: int = 24) -> torch.Tensor:
    """(N, 3, H, W) images: blurred noise with correlated bands, and bright blobs in one band."""
    g = torch.Generator().manual_seed(0)
    base = nn.functional.conv2d(torch.randn(n, 1, side, side, generator=g), torch.ones(1, 1, 5, 5) / 25, padding=2)
    images = torch.cat([base, 0.8 * base + 0.1 * torch.randn(n, 1, side, side, generator=g), 0.5 * base + 0.3], 1)
    for i in range(n):
        images[i, i % 3, 4:10, 6:12] += 1.5
    return images


def test_noisy_tiles_reshaped_from_nhwc_are_found_by_their_lag_c_correlation():
    """Mostly noise, a small coloured patch: the differences show no dip, the correlation at lag 3 does."""
    from optimus_preflight.preflight.checks.input_scale import interleaved_channels

    g = torch.Generator().manual_seed(1)
    colours = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    tiles = 0.3 * torch.randn(128, 12, 12, 3, generator=g)
    for i in range(128):
        r, c = torch.randint(0, 11, (2,), generator=g).tolist()
        tiles[i, r:r + 2, c:c + 2] += colours[i % 3]
    assert interleaved_channels(tiles.reshape(-1, 3, 12, 12)) == 3
    assert interleaved_channels(tiles.permute(0, 3, 1, 2).contiguous()) is None
    assert interleaved_channels(0.3 * torch.randn(128, 3, 12, 12, generator=g)) is None


@pytest.mark.parametrize("layout", ["reshaped_from_nhwc", "permuted_from_nhwc", "noise", "gray_as_rgb"])
def test_channels_last_images_reshaped_instead_of_permuted(layout):
    images = _smooth_rgb()
    nhwc = images.permute(0, 2, 3, 1).contiguous()  # as a NumPy / PIL pipeline holds them
    x = {"reshaped_from_nhwc": nhwc.reshape(images.shape),
         "permuted_from_nhwc": nhwc.permute(0, 3, 1, 2),
         "noise": torch.randn(images.shape, generator=torch.Generator().manual_seed(1)),
         "gray_as_rgb": images[:, :1].expand(-1, 3, -1, -1).contiguous()}[layout]
    y = torch.arange(len(x)) % 3
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), loss_fn=nn.CrossEntropyLoss(),
                           checks=[FirstBatchCheck(), InputScaleCheck()])
    found = [issue for _, issue in report.issues() if issue.code == "CHANNELS_INTERLEAVED"]
    assert bool(found) == (layout == "reshaped_from_nhwc")
    if found:
        assert "period of 3" in found[0].message and "permute(0, 3, 1, 2)" in found[0].fix


@pytest.mark.parametrize("scaled", [False, True], ids=["raw_0_255", "scaled_to_unit"])
def test_raw_data_under_a_diffusion_loss_names_the_swamped_noise(scaled):
    g = torch.Generator().manual_seed(0)
    raw = torch.rand(512, 8, generator=g) * 255
    data = raw / 127.5 - 1 if scaled else raw
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8))

    def noise_prediction(model, batch):
        x0 = batch[0]
        noise = torch.randn_like(x0)
        return F.mse_loss(model(0.7 * x0 + 0.71 * noise), noise)

    report = run_preflight(model, torch.optim.Adam(model.parameters(), 1e-3),
                           DataLoader(TensorDataset(data), batch_size=128, shuffle=True),
                           loss_fn=noise_prediction, checks=[FirstBatchCheck(), InputScaleCheck()])
    found = [i for i in report.check("data.input_scale").issues if i.code == "DP12"]
    assert bool(found) == (not scaled)
    if found:
        assert "unit-variance noise drawn in the loss" in found[0].message and "x / 127.5 - 1" in found[0].fix
