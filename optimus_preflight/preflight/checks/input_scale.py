"""DP12 / DP10: image inputs on the wrong scale, seen where the model first reads them.

``transforms.ToTensor()`` divides by 255 only for PIL images and uint8 arrays: a float
array, a ``.npy`` file or a 16-bit image comes through in 0..255 (or 0..65535), and a
``Normalize`` after it then yields values up to ~1100. The opposite mistakes are a
second ``/ 255`` (pixels in 0..0.004), ``Normalize`` applied twice (per-channel std
~1/std, about 4.4 with ImageNet's), and ``Normalize`` with statistics of the 0..255 scale
on pixels already in [0, 1] (every pixel near one constant).

The data alone cannot tell these from a model that scales its input itself (a uint8
batch divided by 255 in ``forward``, a BatchNorm in front of the first conv), so when
the first batch holds an image-like tensor the check runs ``compute_loss`` once, without
gradients, and reads the values the first conv or linear layer receives; the forward
is cut short right there. Nothing runs for batches without an image-like tensor (token
ids, tabular features). Only clear signatures fire, as warnings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SIDE = 8  # an image is at least 8x8 pixels
MAX_CHANNELS = 4  # gray, RGB, RGBA / RGB-D
STATS_SAMPLES = 16
UNSCALED_MAX = 2.0  # [0, 1] pixels never exceed it; normalised ones are also negative
MAX_8BIT = 255.5
# Non-negative values whose largest is this many times the median of the positive ones: a
# power or magnitude spectrogram without a log (a tone over noise measured 660x, speech spans
# 1e6 and more). Pixels on any scale, and sparse counts, stay within ~10x of that median.
HEAVY_TAIL = 300.0
NORMALISED_UNSCALED_STD = 20.0  # Normalize on 0..255 pixels: std ~ 0.25 * 255 / 0.226 ~ 300
# Normalize twice: std ~ std_pixels / s^2 ~ 4-6 with ImageNet's s ~ 0.226. One Normalize
# of [0, 1] pixels gives at most 0.5 / s ~ 2.2 even for black-and-white images.
TWICE_STD = 3.0
SCALED_TWICE_MAX = 1.05 / 255  # uint8 / 255 / 255
# Normalize with 0..255-scale statistics on [0, 1] pixels: (x - 125) / 63 ~ -1.98 +- 0.004.
FLAT_STD = 0.02
FLAT_MEAN = 0.5
UNIX_SECONDS = (9.0e8, 2.2e9)  # 1998 to 2039: a column averaging there is a timestamp in seconds


# Tabular features: a standardised column has std ~1 and mean ~0; counts, ratings, ages
# and one-hot columns stay within tens. Raw money, years, timestamps, pixel values
# flattened into a row, or sensor readings in their units reach hundreds and more.
MIN_FEATURES = 2
RAW_FEATURE_STD = 50.0
RAW_FEATURE_MEAN = 100.0
# A column that varies by less than this is a constant to the network; a scaling by the whole
# table's min/max (not per column) squeezes every ordinary column into such a band.
SQUEEZED_STD = 1e-4
SQUEEZED_SHARE = 0.25  # of the varying columns
# Values C apart in memory this much closer than values C - 1 and C + 1 apart: a periodic
# pattern no image has along its rows.
INTERLEAVE_DIP = 0.95
INTERLEAVE_SE, INTERLEAVE_RATIO = 5.0, 2.0  # the lag-C correlation: standard errors above 0, times the other lags


class _FirstLayerSeen(BaseException):
    """Ends the forward once the first layer's input is recorded (a BaseException so
    that ``except Exception`` in user code does not swallow it)."""


@dataclass
class ChannelStats:
    mean: float
    std: float
    min: float
    max: float
    integral: bool = False  # whole numbers only: pixel values of an integer image format
    median: float | None = None  # of the positive values


@dataclass
class ScaleFinding:
    code: str  # DP12 | DP10
    kind: str  # unscaled | normalised_unscaled | scaled_twice | normalised_twice | wrong_statistics
    channels: list[int]  # the channels showing it


def image_like(leaf: Any) -> bool:
    """A batch of images: (N, C, H, W) or (N, H, W, C) with 1-4 channels, or (N, H, W)
    when it holds pixel values (uint8, or floats that are whole numbers in 0..255).
    A 3-D float tensor of other values is a batch of sequences, not images."""
    if not isinstance(leaf, torch.Tensor) or not (leaf.is_floating_point() or leaf.dtype == torch.uint8):
        return False
    shape = tuple(leaf.shape)
    if len(shape) == 4:
        first, last = 1 <= shape[1] <= MAX_CHANNELS, 1 <= shape[3] <= MAX_CHANNELS
        return (first and min(shape[2:]) >= MIN_SIDE) or (last and min(shape[1:3]) >= MIN_SIDE)
    if len(shape) == 3 and min(shape[1:]) >= MIN_SIDE:
        if leaf.dtype == torch.uint8:
            return True
        values = leaf.detach()
        return bool(values.numel() and values.min() >= 0 and values.max() <= 255 and (values == values.round()).all())
    return False


def channel_stats(inputs: torch.Tensor, channel_dim: int | None) -> list[ChannelStats]:
    """Per-channel statistics (one entry for the whole tensor when ``channel_dim`` is None),
    over the first ``STATS_SAMPLES`` samples of a batched input: plenty of pixels, and no
    float64 copy of a whole batch of large images."""
    values = inputs.detach()
    if channel_dim != 0 and values.dim() > 1:
        values = values[:STATS_SAMPLES]
    values = values.to(torch.float64)
    if channel_dim is None or values.dim() <= channel_dim:
        groups = [values.reshape(-1)]
    else:
        groups = list(values.movedim(channel_dim, 0).reshape(values.shape[channel_dim], -1))
    return [ChannelStats(float(g.mean()), float(g.std(unbiased=False)), float(g.min()), float(g.max()),
                         bool((g == g.round()).all()), _positive_median(g)) for g in groups if g.numel()]


def _positive_median(values: torch.Tensor) -> float | None:
    """The median of the positive values: sparse inputs (counts, occupancy) are mostly 0."""
    positive = values[values > 0]
    return float(positive.median()) if positive.numel() else None


def scale_finding(stats: list[ChannelStats]) -> ScaleFinding | None:
    """The first clear wrong-scale signature in the per-channel statistics of what the
    first layer receives, or None."""
    if not stats:
        return None
    positive = [i for i, s in enumerate(stats) if s.min >= 0 and s.max > UNSCALED_MAX]
    # Raw pixels: 8-bit values, or whole numbers (16-bit); Normalize of 0..255 pixels
    # reaches ~1100 in fractions, and is negative wherever a pixel is darker than the mean.
    raw = [i for i in positive if stats[i].max <= MAX_8BIT or stats[i].integral]
    if raw:
        return ScaleFinding("DP12", "unscaled", raw)
    heavy = [i for i, s in enumerate(stats) if s.min >= 0 and s.median is not None and s.max > UNSCALED_MAX
             and s.max > HEAVY_TAIL * max(s.median, 1e-12)]
    if heavy and len(heavy) == len([s for s in stats if s.max > 0]):
        return ScaleFinding("DP12", "heavy_tailed", heavy)
    wide = [i for i, s in enumerate(stats) if s.std > NORMALISED_UNSCALED_STD]
    if wide:
        return ScaleFinding("DP12", "normalised_unscaled", wide)
    if positive:
        return ScaleFinding("DP12", "unscaled", positive)
    everything = list(range(len(stats)))
    if all(s.min >= 0 for s in stats) and 0 < max(s.max for s in stats) <= SCALED_TWICE_MAX:
        return ScaleFinding("DP12", "scaled_twice", everything)
    varying = [s for s in stats if s.std > 0]  # a constant channel (alpha, padding) says nothing
    if not varying:
        return None
    if min(s.min for s in stats) < 0 and all(TWICE_STD <= s.std <= NORMALISED_UNSCALED_STD for s in varying):
        return ScaleFinding("DP10", "normalised_twice", everything)
    if all(s.std < FLAT_STD and abs(s.mean) > FLAT_MEAN for s in varying):
        return ScaleFinding("DP10", "wrong_statistics", everything)
    return None


def raw_feature_columns(stats: list[ChannelStats]) -> list[int]:
    """Feature columns on raw scales: a spread or an offset in the hundreds."""
    return [i for i, c in enumerate(stats) if c.std > RAW_FEATURE_STD or abs(c.mean) > RAW_FEATURE_MEAN]


def squeezed_feature_columns(stats: list[ChannelStats]) -> list[int]:
    """Columns that vary, but by less than SQUEEZED_STD, when they are a good share of the
    varying columns (a single tiny column is someone's unit choice)."""
    varying = [i for i, c in enumerate(stats) if c.std > 0]
    squeezed = [i for i in varying if stats[i].std < SQUEEZED_STD]
    return squeezed if len(squeezed) >= max(2, SQUEEZED_SHARE * len(varying)) else []


def describe_raw_features(columns: list[int], seen: FirstLayerInput) -> tuple[str, str]:
    shown = ", ".join(f"{i} (mean {seen.stats[i].mean:.3g}, std {seen.stats[i].std:.3g})" for i in columns[:4])
    more = f" and {len(columns) - 4} more" if len(columns) > 4 else ""
    scaled = len(seen.stats) - len(columns)
    beside = f", beside {scaled} column(s) on a unit scale" if scaled else ""
    stamps = [i for i in columns if UNIX_SECONDS[0] <= seen.stats[i].mean <= UNIX_SECONDS[1]
              or UNIX_SECONDS[0] * 1000 <= seen.stats[i].mean <= UNIX_SECONDS[1] * 1000]
    stamp = (f" Column {stamps[0]}'s values ({seen.stats[stamps[0]].mean:.3g}) look like a raw Unix timestamp (epoch "
             "seconds or milliseconds since 1970): as a number it is a huge, ever-growing offset that says nothing "
             "the model can use; derive features from it (hour, weekday, elapsed time) and scale those."
             if stamps else "")
    message = (f"the first layer ({seen.kind} {seen.layer!r}) receives {len(columns)} of its {len(seen.stats)} feature "
               f"columns on raw scales: column(s) {shown}{more}{beside}. Unstandardised features make the first layer's "
               "output and its gradients dominated by the largest columns: the network learns slowly or not at all, "
               f"and a learning rate that suits one column diverges on another.{stamp}")
    fix = ("Standardise every feature column with the training split's statistics: mean = x_train.mean(0), "
           "std = x_train.std(0); x = (x - mean) / std in the dataset (the same mean and std for validation), or "
           "put nn.BatchNorm1d(features) in front of the first layer.")
    return message, fix


SIGNIFICANT_BITS = {"bf16": 8, "fp16": 11}


def rounded_in_half_precision(columns: list[int], seen: FirstLayerInput, precision: str) -> str:
    """What autocast does to offset columns: a value near m is rounded to a spacing of about
    m / 2**bits, and a spread smaller than that spacing is lost before the first layer."""
    bits = SIGNIFICANT_BITS.get(str(precision))
    if bits is None:
        return ""
    lost = [i for i in columns if seen.stats[i].std < 2.0 * abs(seen.stats[i].mean) / 2 ** bits]
    if not lost:
        return ""
    column = seen.stats[lost[0]]
    spacing = 2.0 ** math.floor(math.log2(abs(column.mean))) / 2 ** (bits - 1)
    return (f". Under {precision} autocast it is worse: the first layer casts its input to {precision}, whose "
            f"{bits} significant bits space numbers near {abs(column.mean):.4g} by {spacing:.3g}, while column "
            f"{lost[0]} varies by a std of {column.std:.3g}: the signal in {len(lost)} column(s) is rounded away "
            "before the model sees it (standardising first keeps it)")


SENTINEL_SHARE = 0.03  # of the rows holding the one repeated value
SQUEEZED_REST = 0.02  # the other rows' std, as a share of the column's


def sentinel_columns(table: torch.Tensor) -> list[tuple[int, float, float, float, float]]:
    """(column, repeated value, its share, the other rows' std, the column's std) for columns
    where one value is a sizeable share of the rows and the others are squeezed next to each
    other: a missing-value sentinel that sets the column's statistics (pure)."""
    found = []
    values = table.detach().float().cpu()
    for column in range(values.shape[1]):
        v = values[:, column]
        v = v[torch.isfinite(v)]
        if v.numel() < 32 or float(v.std()) == 0:
            continue
        uniques, counts = torch.unique(v, return_counts=True)
        top = int(counts.argmax())
        share = float(counts[top]) / v.numel()
        rest = v[v != uniques[top]]
        if share < SENTINEL_SHARE or share > 0.9 or rest.numel() < 8 or len(torch.unique(rest)) < 5:
            continue
        rest_std, std = float(rest.std()), float(v.std())
        if 0 < rest_std < SQUEEZED_REST * std:
            found.append((column, float(uniques[top]), share, rest_std, std))
    return found


@dataclass
class FirstLayerInput:
    layer: str
    kind: str  # the module's class name
    stats: list[ChannelStats]


def first_layer_input(ctx: PreflightContext, batch: Any, *, tabular: bool = False) -> FirstLayerInput | None:
    """What the first conv or linear layer that reads image-sized input receives when
    ``compute_loss`` runs on ``batch`` (train mode, as training runs it; no gradients;
    the forward stops at that layer). ``tabular``: the first linear layer that reads a
    (samples, features) input instead, with statistics per feature column.
    None when no such layer runs or the loss raises before it (step.first_step reports that)."""
    model = ctx.model
    kinds = (nn.Linear,) if tabular else (nn.modules.conv._ConvNd, nn.Linear)
    layers = {module: name for name, module in model.named_modules() if isinstance(module, kinds)}
    if not layers:
        return None
    seen: list[FirstLayerInput] = []

    def record(module: nn.Module, args: tuple) -> None:
        inputs = args[0] if args else None
        if not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point():
            raise _FirstLayerSeen()
        if tabular:
            if inputs.dim() != 2 or inputs.shape[1] < MIN_FEATURES:
                raise _FirstLayerSeen()  # not a table of features: nothing to judge
            seen.append(FirstLayerInput(layers[module] or type(module).__name__, type(module).__name__,
                                        channel_stats(inputs, 1)))
            raise _FirstLayerSeen()
        if inputs.numel() < MIN_SIDE * MIN_SIDE * max(batch_size_of(batch), 1):
            return  # a layer on a conditioning input (a timestep, a class vector), not on the image
        # A conv's channels are dim 1 of a batched input; a linear layer mixes all of its features.
        is_conv = isinstance(module, nn.modules.conv._ConvNd)
        spatial = len(getattr(module, "kernel_size", ()))
        channel_dim = (1 if inputs.dim() == spatial + 2 else 0) if is_conv else None
        seen.append(FirstLayerInput(layers[module] or type(module).__name__, type(module).__name__,
                                    channel_stats(inputs, channel_dim)))
        raise _FirstLayerSeen()

    handles = [module.register_forward_pre_hook(record) for module in layers]
    try:
        with preserved_training_state(ctx), torch.no_grad():
            model.train()  # a BatchNorm in front of the first conv normalises as in training
            with ctx.training.plan.autocast():
                ctx.compute_loss(model, move_to_device(batch, ctx.device))
    except _FirstLayerSeen:
        pass
    except Exception:  # the loss is broken: step.first_step reports it
        return None
    finally:
        for handle in handles:
            handle.remove()
    return seen[0] if seen else None


def _numbers(values: list[float]) -> str:
    return "[" + ", ".join(f"{value:.3g}" for value in values) + "]"


def describe(finding: ScaleFinding, seen: FirstLayerInput, batch_dtype: torch.dtype) -> tuple[str, str, str, str | None]:
    """(message, fix, code fix, config key) for a finding: the dataset's transform is
    ``data.train``'s code; a conversion inside the model is no config's."""
    stats = seen.stats
    low, high = min(s.min for s in stats), max(s.max for s in stats)
    means, stds = _numbers([s.mean for s in stats]), _numbers([s.std for s in stats])
    where = f"the first layer ({seen.kind} {seen.layer!r}) receives values in [{low:.3g}, {high:.3g}]"
    dataset = "In the dataset of the DataLoader your build_dataloaders() returns, "
    if finding.kind == "unscaled":
        picked = ", ".join(str(i) for i in finding.channels)
        top = max(stats[i].max for i in finding.channels)
        depth = "0..65535 (16-bit images)" if top > MAX_8BIT else "0..255"
        channels = "" if len(finding.channels) == len(stats) else f" in channel(s) {picked}"
        if batch_dtype == torch.uint8:
            message = (f"{where}{channels}: the batch holds uint8 pixels and the model converts them to float without "
                       "dividing by 255, so activations and gradients are ~255x too large")
            fix = "Divide by 255 where the model converts the uint8 input: x = x.float() / 255 (then normalise)."
            return message, fix, fix, None
        message = (f"{where}{channels} (per-channel means {means}): the pixels were never scaled from {depth} to "
                   "[0, 1], so activations and gradients are ~255x too large. transforms.ToTensor() divides by 255 "
                   "only for PIL images and uint8 arrays; float arrays, .npy files and 16-bit images come through "
                   "unscaled")
        how = ("scale the pixels explicitly: torch.from_numpy(array).float() / 255 (/ 65535 for 16-bit images), "
               "or keep uint8 arrays for ToTensor() / transforms.v2.ToDtype(torch.float32, scale=True); then "
               "Normalize(mean, std).")
        return message, "In the dataset's transform, " + how, dataset + how, "data.train"
    if finding.kind == "heavy_tailed":
        median = min(stats[i].median or 0.0 for i in finding.channels)
        ratio = high / max(median, 1e-12)
        message = (f"{where}: non-negative values whose largest is {ratio:,.0f} times the median ({median:.3g}), "
                   "a power or magnitude spectrogram (or counts) fed without a log: the few largest bins dominate "
                   "every activation, the rest read as ~0, and gradients swing with the loudest input")
        how = ("compress the range before the model: torch.log(spec + 1e-6), or torchaudio.transforms.AmplitudeToDB() "
               "for a (mel) spectrogram, log1p for counts; then standardise with the training set's mean and std.")
        return message, "In the dataset's transform, " + how, dataset + how, "data.train"
    if finding.kind == "normalised_unscaled":
        message = (f"{where} with per-channel std {stds} (a normalised image has ~1): Normalize(mean, std) was applied "
                   "to pixels still in 0..255 (transforms.ToTensor() does not divide float or 16-bit data by 255), "
                   "so inputs are ~255x too large")
        how = ("divide the pixels by 255 (torch.from_numpy(array).float() / 255) before Normalize(mean, std), or keep "
               "uint8 arrays so that ToTensor() scales them.")
        return message, "In the dataset's transform, " + how, dataset + how, "data.train"
    if finding.kind == "scaled_twice":
        message = (f"{where}: the pixels were divided by 255 twice (ToTensor() already scales uint8 and PIL images to "
                   "[0, 1]), so the inputs are ~255x too small")
        how = "drop the extra / 255 after ToTensor() (or ToDtype(scale=True))."
        return message, "In the dataset's transform, " + how, dataset + how, "data.train"
    if finding.kind == "normalised_twice":
        message = (f"{where} with per-channel std {stds} and means {means}, where one Normalize(mean, std) gives ~1 "
                   "and ~0: the normalisation was applied twice (e.g. in the dataset's transform and again in "
                   "the model or collate_fn), which stretches inputs by 1/std (~4.4 with ImageNet's statistics)")
        how = "apply Normalize(mean, std) exactly once: in the dataset's transform or in the model, not both."
        return message, "Where the inputs are normalised, " + how, "Where your code normalises the inputs, " + how, None
    message = (f"{where}, every channel nearly constant (means {means}, std {stds}): Normalize used statistics of "
               "the 0..255 scale (e.g. mean=[125.3, 123.0, 113.9]) on pixels already scaled to [0, 1] by "
               "ToTensor(), which flattens the images to a near-constant input")
    how = "divide that mean and std by 255, or compute them on the tensors ToTensor() returns."
    return message, "In the dataset's Normalize, " + how, dataset + "in its Normalize, " + how, "data.train"


def interleaved_channels(images: torch.Tensor, samples: int = 64) -> int | None:
    """The channel count C when an (N, C, H, W) batch is a channels-last (N, H, W, C) array
    reshaped, not permuted (pure): read in memory order, each value's nearest relatives are
    C steps away (the same band at the next pixel), so the mean absolute difference between
    values k apart dips at k = C and again at 2C, where an image's only grows with k."""
    if images.dim() != 4 or not 2 <= images.shape[1] <= MAX_CHANNELS or min(images.shape[2:]) < MIN_SIDE:
        return None
    channels = images.shape[1]
    flat = images[:samples].reshape(min(samples, images.shape[0]), -1).float()
    gap = {k: float((flat[:, k:] - flat[:, :-k]).abs().mean()) for k in range(1, 2 * channels + 2)}
    if gap[channels] <= 0:
        return None
    first_dip = gap[channels] < INTERLEAVE_DIP * min(gap[channels - 1], gap[channels + 1])
    second_dip = gap[2 * channels] < min(gap[2 * channels - 1], gap[2 * channels + 1])
    if first_dip and second_dip:
        return channels
    # Noisy images hide the dips in the differences; the correlation at lag C still stands out
    # from its neighbours (and from lag 1, an aligned image's strongest) by many standard errors.
    centred = (flat - flat.mean(dim=1, keepdim=True)).double()

    def correlation(k: int) -> float:
        a, b = centred[:, k:], centred[:, :-k]
        return float((a * b).sum() / (a.norm() * b.norm()).clamp_min(1e-30))

    at_period = correlation(channels)
    others = max(correlation(k) for k in {1, channels - 1, channels + 1} if k >= 1)
    standard_error = centred.numel() ** -0.5
    strong = at_period >= INTERLEAVE_SE * standard_error and at_period >= INTERLEAVE_RATIO * max(others, standard_error)
    return channels if strong else None


SWAMPED = 10.0  # data this many times the noise's spread


def noise_swamped(ctx: PreflightContext, data_std: float) -> tuple[str, str]:
    """The sentence and fix for raw-scale data under a diffusion loss: the criterion's target is
    unit-variance noise drawn in the loss, which data of this spread swamps; ("", "") otherwise."""
    from optimus_preflight.preflight.analyses.probe import NOISE_STD, get_probe

    if data_std < SWAMPED * NOISE_STD[1]:
        return "", ""
    probe = get_probe(ctx)
    if not probe.completed or not any(call.target_is_drawn_noise for call in probe.criterion_calls):
        return "", ""
    return (f". The criterion's target is unit-variance noise drawn in the loss (a diffusion model's noise "
            f"prediction): against data on this scale (std up to {data_std:.3g}) the noise the forward process adds "
            "is negligible, x_t is almost the clean data at every timestep, and the noise cannot be told from it",
            "Scale the data to [-1, 1] before the forward process (x / 127.5 - 1 for 0-255 values, or standardise), "
            "so the noise schedule's variances mean what they say. ")


class InputScaleCheck(Check):
    """DP12 / DP10: image inputs not scaled to [0, 1], scaled or normalised twice, or
    normalised with statistics of the wrong scale; tabular feature columns on raw scales
    (DP12); read at the first conv/linear layer."""

    name = "data.input_scale"
    stage = Stage.DATA
    codes = ("DP10", "DP12", "CHANNELS_INTERLEAVED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        images = [leaf for leaf in leaves(batch) if image_like(leaf)]
        if not images:
            self._tabular(ctx, batch, findings)
            return
        interleaved = next((image for image in images if interleaved_channels(image.detach().cpu()) is not None), None)
        if interleaved is not None:
            shape, channels = tuple(interleaved.shape), interleaved.shape[1]
            findings.warning(
                "CHANNELS_INTERLEAVED",
                f"the {shape} images repeat with a period of {channels} values along each row: in memory, each "
                f"value's nearest relative is {channels} values away, the same band at the next pixel. That is a "
                f"channels-last (N, H, W, {channels}) array turned into (N, {channels}, H, W) with reshape or view "
                "instead of permute: every 'channel' plane interleaves the bands of neighbouring pixels, and the "
                "convolutions see scrambled images",
                "Move the channel axis with x.permute(0, 3, 1, 2) (NumPy: x.transpose(0, 3, 1, 2)), not "
                "x.reshape(N, C, H, W) or x.view(...); torchvision's ToTensor() does it for H x W x C arrays.",
                "data.train",
            )
        seen = first_layer_input(ctx, batch)
        if seen is None:
            findings.data["summary"] = "no conv/linear layer reached"
            return
        findings.data.update(layer=seen.layer, channels=[
            {"mean": round(s.mean, 4), "std": round(s.std, 4), "min": round(s.min, 4), "max": round(s.max, 4)}
            for s in seen.stats])
        low, high = min(s.min for s in seen.stats), max(s.max for s in seen.stats)
        findings.data["summary"] = f"{seen.layer} receives values in [{low:.3g}, {high:.3g}]"
        finding = scale_finding(seen.stats)
        if finding is None:
            return
        findings.data["signature"] = finding.kind
        message, fix, code_fix, key = describe(finding, seen, images[0].dtype)
        findings.warning(finding.code, message, fix, key, code_fix=code_fix)

    @staticmethod
    def _tabular(ctx: PreflightContext, batch: Any, findings: Findings) -> None:
        """A (samples, features) float table read by a first linear layer."""
        tables = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
                  and leaf.dim() == 2 and leaf.shape[1] >= MIN_FEATURES]
        if not tables:
            findings.data["summary"] = "no image-like or tabular input in the first batch"
            return
        seen = first_layer_input(ctx, batch, tabular=True)
        if seen is None:
            findings.data["summary"] = "no linear layer reads a table of features first"
            return
        columns = raw_feature_columns(seen.stats)
        findings.data.update(layer=seen.layer, features=len(seen.stats), raw_columns=columns[:20])
        findings.data["summary"] = f"{seen.layer} receives {len(seen.stats)} features, {len(columns)} on raw scales"
        if columns:
            findings.data["signature"] = "features_unscaled"
            message, fix = describe_raw_features(columns, seen)
            message += rounded_in_half_precision(columns, seen, ctx.training.plan.precision)
            swamped = noise_swamped(ctx, max(seen.stats[c].std for c in columns))
            message += swamped[0]
            fix = swamped[1] + fix
            findings.warning("DP12", message, fix, "data.train", code_fix=fix)
        table = next((t for t in tables if t.shape[1] == len(seen.stats)), None)
        sentinels = sentinel_columns(table) if table is not None else []
        if sentinels:
            column, value, share, rest_std, std = sentinels[0]
            findings.warning(
                "DP12",
                f"feature column {column} of the first layer's input is dominated by one repeated value: {share:.0%} of "
                f"the rows are {value:.4g}, and the other rows vary by a std of {rest_std:.2g} against the column's "
                f"{std:.2g}" + (f" ({len(sentinels)} such columns)" if len(sentinels) > 1 else "") + ": a sentinel for "
                "missing values (-999, the gradient-boosting habit) filled in before standardising sets the column's "
                "mean and std, so the real values, which carry the signal, are squeezed into a sliver next to the "
                "spike and the network barely sees them",
                "Fill missing values with the column's training mean or median (and add a 0/1 'was missing' column), "
                "then standardise; or standardise with statistics of the observed values only.",
                "data.train",
            )
        squeezed = squeezed_feature_columns(seen.stats)
        if squeezed:
            findings.data["signature"] = "features_squeezed"
            shown = ", ".join(f"{i} (std {seen.stats[i].std:.2g})" for i in squeezed[:4])
            more = f" and {len(squeezed) - 4} more" if len(squeezed) > 4 else ""
            fix = ("Scale each column with its own statistics (axis 0): (X - X.min(0)) / (X.max(0) - X.min(0)), or "
                   "(X - X.mean(0)) / X.std(0), computed on the training split; drop identifier columns (account or "
                   "row numbers) from the features.")
            findings.warning(
                "DP12",
                f"the first layer ({seen.kind} {seen.layer!r}) receives {len(squeezed)} of its {len(seen.stats)} feature "
                f"columns squeezed into a band under {SQUEEZED_STD:g} wide: column(s) {shown}{more}. To the network "
                "they are constants. A scaling by the whole table's min and max (X.min(), not X.min(0)) or by another "
                "column's range, where one column spans millions (an ID), does this",
                fix, "data.train", code_fix=fix)
