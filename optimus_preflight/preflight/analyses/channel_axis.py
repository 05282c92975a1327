"""A convolution's channel axis reduced together with one spatial axis.

``F.conv2d`` returns ``(B, C, H, W)``. A global pool over it reduces ``(2, 3)``; code
ported from Keras (``GlobalAveragePooling2D`` on ``(B, H, W, C)``) reduces ``(1, 2)``,
which on an NCHW map averages the channels and the height away and keeps the width.
When ``W == C`` the next layer's shapes still match, and the head reads one number per
image column instead of the features. Reducing the channels alone (CBAM's spatial
attention: ``x.mean(dim=1, keepdim=True)``) or both spatial axes is a real design; the
channel axis and exactly one spatial axis together is not.

The watch follows the conv's output through the ops that keep its layout (activations,
normalisation, residual adds, pooling: ``KEEP_LAYOUT``, a 4-D result with the same channel
count) and
records the first reduction that mixes its channel axis with one spatial axis.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

CONVOLUTIONS = ("conv2d", "conv_transpose2d")
# Ops that keep an NCHW map NCHW. A whitelist: a permute to NHWC of a map whose height
# equals its channel count would otherwise pass for the same layout.
KEEP_LAYOUT = frozenset({
    "relu", "relu_", "relu6", "gelu", "silu", "mish", "elu", "selu", "leaky_relu", "hardswish", "hardtanh", "sigmoid",
    "tanh", "softplus", "batch_norm", "group_norm", "instance_norm", "dropout", "dropout2d", "feature_dropout",
    "add", "__add__", "__radd__", "add_", "__iadd__", "mul", "__mul__", "__rmul__", "sub", "__sub__", "div",
    "__truediv__", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "max_pool2d_with_indices",
    "interpolate", "upsample", "pad", "clone", "contiguous", "float", "to", "type_as"})
REDUCTIONS = ("mean", "sum", "amax", "amin", "max", "min", "std", "var", "logsumexp", "nanmean", "nansum")


@dataclass
class ChannelReduction:
    function: str
    dims: tuple[int, ...]
    shape: tuple[int, ...]  # of the NCHW map reduced


def _dims(args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dim, int) and not isinstance(dim, bool):
        return (dim % 4,)
    if isinstance(dim, (tuple, list)) and dim and all(isinstance(d, int) for d in dim):
        return tuple(sorted(d % 4 for d in dim))
    return None


class ChannelAxisWatch:
    """Feed it every torch function call (``observe``); ``found`` holds the first channel +
    one spatial axis reduction of a convolution's output."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[weakref.ref, int]] = {}  # id -> (the tensor, its channel count)
        self.found: ChannelReduction | None = None

    def _channels_of(self, tensor: Any) -> int | None:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            return None
        entry = self._maps.get(id(tensor))
        return entry[1] if entry is not None and entry[0]() is tensor else None

    def _tag(self, tensor: torch.Tensor, channels: int) -> None:
        self._maps[id(tensor)] = (weakref.ref(tensor), channels)

    def observe(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        if self.found is not None or not args:
            return
        if name in CONVOLUTIONS:
            if isinstance(out, torch.Tensor) and out.dim() == 4:
                self._tag(out, int(out.shape[1]))
            return
        channels = self._channels_of(args[0])
        if channels is None:
            return
        if name in REDUCTIONS:
            dims = _dims(args, kwargs)
            if dims is not None and 1 in dims and len(set(dims) & {2, 3}) == 1:
                self.found = ChannelReduction(name, dims, tuple(args[0].shape))
            return
        if name in KEEP_LAYOUT and isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[1] == channels:
            self._tag(out, channels)
