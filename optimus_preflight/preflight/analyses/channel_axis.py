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
CONVOLUTIONS_1D = ("conv1d", "conv_transpose1d")
# Ops that keep an (N, C, L) map (N, C, L), as KEEP_LAYOUT does for NCHW.
KEEP_LAYOUT_1D = frozenset({
    "relu", "relu_", "relu6", "gelu", "silu", "mish", "elu", "selu", "leaky_relu", "hardswish", "hardtanh", "sigmoid",
    "tanh", "softplus", "batch_norm", "group_norm", "instance_norm", "dropout", "feature_dropout", "add", "__add__",
    "__radd__", "add_", "__iadd__", "mul", "__mul__", "__rmul__", "sub", "__sub__", "div", "__truediv__",
    "max_pool1d", "avg_pool1d", "adaptive_avg_pool1d", "adaptive_max_pool1d", "max_pool1d_with_indices", "pad",
    "clone", "contiguous", "float", "to", "type_as"})
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


SOFTMAXES = ("softmax", "log_softmax")
RESHAPES = ("view", "reshape", "flatten")
SWAPS = ("transpose", "swapaxes", "permute")


@dataclass
class ClassesMisread:
    """Class scores read from an NCHW map along the wrong axes: ``kind`` is ``softmax`` (a
    softmax over one spatial axis), ``split`` (``view(N, -1, c)`` of ``(N, A*c, H, W)``) or
    ``swapped`` (``transpose(1, 3)`` then flattened: classes last, height and width swapped)."""

    kind: str
    function: str
    shape: tuple[int, ...]  # of the NCHW map
    detail: tuple[int, ...]  # softmax: (dim,); split: the view's shape; swapped: the transposed shape


def _softmax_dim(args: tuple, kwargs: dict) -> int | None:
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return dim % 4 if isinstance(dim, int) and not isinstance(dim, bool) else None


def _swap_order(name: str, args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """The axis order of a transpose/permute of a 4-D tensor (pure on its arguments)."""
    if name == "permute":
        dims = args[1:] if len(args) > 2 else (args[1] if len(args) > 1 else kwargs.get("dims"))
        dims = tuple(dims) if isinstance(dims, (tuple, list)) else None
        return tuple(d % 4 for d in dims) if dims and len(dims) == 4 and all(isinstance(d, int) for d in dims) else None
    first, second = (args[1], args[2]) if len(args) > 2 else (kwargs.get("dim0"), kwargs.get("dim1"))
    if not (isinstance(first, int) and isinstance(second, int)):
        return None
    order = [0, 1, 2, 3]
    order[first % 4], order[second % 4] = order[second % 4], order[first % 4]
    return tuple(order)


def _split_channels(shape: tuple[int, ...], result: tuple[int, ...]) -> bool:
    """A view of an (N, K, H, W) map whose last axis takes c of the K channels' values, 1 < c < K,
    c dividing K, while the memory runs along the width: each row holds neighbouring positions of
    one channel, not one position's c channels (pure). A last axis of W, of H*W or of a multiple
    of H*W keeps whole rows or maps together, which is a layout, not this mistake."""
    if len(result) < 2 or len(shape) != 4 or result[0] != shape[0]:
        return False
    channels, height, width, classes = shape[1], shape[2], shape[3], result[-1]
    return (1 < classes < channels and channels % classes == 0 and classes != width
            and classes % (height * width) != 0 and height * width > 1)


class ChannelAxisWatch:
    """Feed it every torch function call (``observe``); ``found`` holds the first channel +
    one spatial axis reduction of a convolution's output, ``misread`` the first class scores
    read from it along the wrong axes."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[weakref.ref, int]] = {}  # id -> (the tensor, its channel count)
        self._maps_1d: dict[int, tuple[weakref.ref, int]] = {}  # ... of (N, C, L) conv1d maps
        self._swapped: dict[int, tuple[weakref.ref, tuple[int, ...], tuple[int, ...]]] = {}
        self.found: ChannelReduction | None = None
        self.misread: ClassesMisread | None = None

    def _channels_of(self, tensor: Any) -> int | None:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            return None
        entry = self._maps.get(id(tensor))
        return entry[1] if entry is not None and entry[0]() is tensor else None

    def _tag(self, tensor: torch.Tensor, channels: int) -> None:
        self._maps[id(tensor)] = (weakref.ref(tensor), channels)

    def _observe_1d(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """An (N, C, L) conv map reduced over its channel axis alone, the length kept (no
        keepdim: a channel-mean kept as a map is spatial attention): Keras'
        GlobalAveragePooling1D, mean(dim=1) of (N, L, C), ported onto PyTorch's (N, C, L)."""
        if name in CONVOLUTIONS_1D:
            if isinstance(out, torch.Tensor) and out.dim() == 3:
                self._maps_1d[id(out)] = (weakref.ref(out), int(out.shape[1]))
            return
        source = args[0]
        entry = self._maps_1d.get(id(source)) if isinstance(source, torch.Tensor) and source.dim() == 3 else None
        if entry is None or entry[0]() is not source:
            return
        if name in REDUCTIONS:
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            dims = (dim,) if isinstance(dim, int) and not isinstance(dim, bool) else tuple(dim) \
                if isinstance(dim, (tuple, list)) and all(isinstance(d, int) for d in dim) else None
            keepdim = bool(args[2] if len(args) > 2 and isinstance(args[2], bool) else kwargs.get("keepdim", False))
            if dims is not None and {d % 3 for d in dims} == {1} and not keepdim and source.shape[2] > 1:
                self.found = ChannelReduction(name, (1,), tuple(source.shape))
            return
        if name in KEEP_LAYOUT_1D and isinstance(out, torch.Tensor) and out.dim() == 3 and out.shape[1] == entry[1]:
            self._maps_1d[id(out)] = (weakref.ref(out), entry[1])

    def observe(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        if (self.found is not None and self.misread is not None) or not args:
            return
        if self.found is None and (name in CONVOLUTIONS_1D or self._maps_1d):
            self._observe_1d(name, args, kwargs, out)
        if name in CONVOLUTIONS:
            if isinstance(out, torch.Tensor) and out.dim() == 4:
                self._tag(out, int(out.shape[1]))
            return
        if self.misread is None:
            self._misread(name, args, kwargs, out)
        channels = self._channels_of(args[0])
        if channels is None or self.found is not None:
            return
        if name in REDUCTIONS:
            dims = _dims(args, kwargs)
            if dims is not None and 1 in dims and len(set(dims) & {2, 3}) == 1:
                self.found = ChannelReduction(name, dims, tuple(args[0].shape))
            return
        if name in KEEP_LAYOUT and isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[1] == channels:
            self._tag(out, channels)

    def _misread(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        source = args[0]
        if name in RESHAPES and isinstance(source, torch.Tensor) and isinstance(out, torch.Tensor):
            entry = self._swapped.get(id(source))
            if entry is not None and entry[0]() is source and out.dim() == 2 and out.shape[1] == entry[1][1]:
                self.misread = ClassesMisread("swapped", name, entry[1], entry[2])
                return
        if self._channels_of(source) is None:
            return
        shape = tuple(source.shape)
        if name in SOFTMAXES and (dim := _softmax_dim(args, kwargs)) in (2, 3) and shape[dim] > 1:
            self.misread = ClassesMisread("softmax", name, shape, (dim,))
        elif name in RESHAPES[:2] and isinstance(out, torch.Tensor) and _split_channels(shape, tuple(out.shape)):
            self.misread = ClassesMisread("split", name, shape, tuple(out.shape))
        elif name in SWAPS and isinstance(out, torch.Tensor) and (order := _swap_order(name, args, kwargs)) is not None \
                and order[3] == 1 and order[1:3] == (3, 2):
            # classes moved last with height and width swapped: transpose(1, 3) gives (N, W, H, C)
            self._swapped[id(out)] = (weakref.ref(out), shape, tuple(out.shape))
