"""One layer fed the batch's data and a bounded output that cannot reach it (pure recording).

A GAN's discriminator reads real samples from the batch and generated ones from a generator
that ends in tanh (or sigmoid): the generated values lie in [-1, 1] (or [0, 1]). Real data left
unscaled (images in [0, 255] or [0, 1] beside a tanh, raw measurements around 3) lies mostly
outside that range, so the discriminator separates the two by range alone and the generator can
never produce what it is trained to imitate. The same holds for any layer that compares data with
a bounded reconstruction (a consistency term through a shared encoder).

Watched by the loss spy during the first step: the storages of tanh / sigmoid outputs (a
``.detach()`` keeps its storage), and for each linear / convolution weight (by storage, so a
weight detached for ``functional_call`` is the same layer) what it was fed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from optimus_preflight.training.sharding import held_whole

BOUNDS = {"tanh": (-1.0, 1.0), "sigmoid": (0.0, 1.0)}
LAYERS = ("linear", "conv1d", "conv2d", "conv3d")
OUTSIDE = 0.5  # share of the batch's values outside the bounded output's range
MAX_VALUES = 4096


@dataclass
class RangeMismatch:
    activation: str  # the bounded output's last op
    low: float
    high: float
    outside: float  # share of the data's values outside [low, high]
    data_range: tuple[float, float]  # the data's 5th and 95th percentiles
    shape: tuple[int, ...]  # of the data the layer read


@dataclass
class RangeWatch:
    batch_storages: set[int] = field(default_factory=set)
    bounded: dict[int, str] = field(default_factory=dict)  # storage of a tanh / sigmoid output -> its op
    fed_bounded: dict[int, str] = field(default_factory=dict)  # weight storage -> the bounded op it read
    fed_data: dict[int, torch.Tensor] = field(default_factory=dict)  # weight storage -> a sample of the data read
    found: RangeMismatch | None = None

    def before(self, name: str, args: tuple) -> None:
        if name not in LAYERS or len(args) < 2 or self.found is not None:
            return
        given, weight = args[0], args[1]
        if not (isinstance(given, torch.Tensor) and isinstance(weight, torch.Tensor)) or not given.is_floating_point() \
                or given.layout != torch.strided or weight.layout != torch.strided \
                or not (held_whole(given) and held_whole(weight)):  # sharded: no storage of its own
            return
        layer, storage = weight.untyped_storage().data_ptr(), given.untyped_storage().data_ptr()
        if storage in self.bounded:
            self.fed_bounded[layer] = self.bounded[storage]
        elif storage in self.batch_storages and layer not in self.fed_data:
            self.fed_data[layer] = given.detach().reshape(-1)[:MAX_VALUES].float().cpu()
        if layer in self.fed_bounded and layer in self.fed_data:
            self.found = mismatch(self.fed_bounded[layer], self.fed_data[layer], tuple(given.shape))

    def after(self, name: str, out: object) -> None:
        if name in BOUNDS and isinstance(out, torch.Tensor) and out.layout == torch.strided and len(self.bounded) < 256:
            self.bounded[out.untyped_storage().data_ptr()] = name

    def release(self) -> None:
        self.fed_data.clear()


def mismatch(activation: str, data: torch.Tensor, shape: tuple[int, ...]) -> RangeMismatch | None:
    """The data's values mostly outside the range of ``activation``'s outputs (pure)."""
    if data.numel() < 16 or not bool(torch.isfinite(data).all()):
        return None
    low, high = BOUNDS[activation]
    outside = float(((data < low) | (data > high)).float().mean())
    if outside < OUTSIDE:
        return None
    return RangeMismatch(activation, low, high, outside,
                         (float(data.quantile(0.05)), float(data.quantile(0.95))), shape)
