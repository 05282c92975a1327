"""A spectral transform taken across the channels instead of along time (``FFT_OVER_CHANNELS``).

``torch.fft.rfft(x)`` transforms ``dim=-1``. On windows laid out ``(B, T, C)`` (time steps
by sensor channels, the usual layout of a time-series loader) that is the channel axis: each
time step's handful of channels is transformed, and the "spectrum" the model learns from
says nothing about frequencies in time. Nothing raises: the result has a plausible shape.

Fed every torch function call the loss spy sees during the step: a one-dim forward
transform (``torch.fft.fft``, ``rfft``, ``fftn``/``rfftn`` over one dim) along a dim of size
``<= SHORT`` (not dim 0, the batch) while the input has another non-batch dim of size
``>= LONG`` (the time axis). A transform along the time axis, or the default dim of a
``(B, C, T)`` layout, is not recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# torch.fft's functions as the spy sees them (``__name__``), and their public names.
TRANSFORMS = {"fft_fft": "torch.fft.fft", "fft_rfft": "torch.fft.rfft", "fft_fftn": "torch.fft.fftn",
              "fft_rfftn": "torch.fft.rfftn"}
SHORT = 8  # a transformed axis this short is channels, not a signal
LONG = 32  # another axis this long is the signal's time axis


@dataclass
class FftOverChannels:
    function: str  # "torch.fft.rfft"
    shape: tuple[int, ...]  # of its input
    dim: int  # transformed, non-negative
    long_dim: int  # the longest other non-batch axis


def _one_dim(name: str, args: tuple, kwargs: dict, rank: int) -> int | None:
    """The single dim a transform runs over, non-negative; None for several or all dims."""
    if name in ("fft_fft", "fft_rfft"):
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    else:  # fftn/rfftn: dim=None (every dim, or the last len(s)) is not one dim
        dim = args[2] if len(args) > 2 else kwargs.get("dim")
        if isinstance(dim, (tuple, list)) and len(dim) == 1:
            dim = dim[0]
    if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
        return None
    return dim % rank


def fft_over_channels(name: str, args: tuple, kwargs: dict) -> FftOverChannels | None:
    """The transform call's input when it runs over a short axis beside a long one (pure)."""
    if name not in TRANSFORMS or not args:
        return None
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    dim = _one_dim(name, args, kwargs, x.dim())
    if dim is None or dim == 0 or not 1 < x.shape[dim] <= SHORT:
        return None
    others = [axis for axis in range(1, x.dim()) if axis != dim]
    long_dim = max(others, key=lambda axis: x.shape[axis])
    if x.shape[long_dim] < LONG:
        return None
    return FftOverChannels(TRANSFORMS[name], tuple(x.shape), dim, long_dim)


class SpectralWatch:
    """Feed it every torch function call (``observe``); ``found`` holds the first transform
    over a short axis."""

    def __init__(self) -> None:
        self.found: FftOverChannels | None = None

    def observe(self, name: str, args: tuple, kwargs: dict) -> None:
        if self.found is None and name in TRANSFORMS:
            self.found = fft_over_channels(name, args, kwargs)


def fft_over_channels_text(found: FftOverChannels) -> tuple[str, str]:
    """(message, fix) of FFT_OVER_CHANNELS."""
    size, length = found.shape[found.dim], found.shape[found.long_dim]
    short = found.function.rpartition(".")[2]
    default = " (its default dim=-1)" if found.dim == len(found.shape) - 1 else ""
    layout = "(B, T, C)" if len(found.shape) == 3 and found.long_dim == 1 and found.dim == 2 else "the layout"
    return (
        f"{found.function} transforms dim {found.dim}{default} of a {found.shape} tensor, an axis of only {size}, "
        f"while dim {found.long_dim} holds {length} steps: on {layout} windows that is a transform across the "
        f"{size} channels at each time step, not along time, so the 'spectrum' holds no frequency of the signal "
        f"(the model learns from channel mixtures instead). Nothing raises: the output shape looks plausible",
        f"Transform along the time axis: torch.fft.{short}(x, dim={found.long_dim}), or transpose the windows to "
        f"(B, C, T) first (x.transpose({found.long_dim}, {found.dim})) so that the default dim=-1 is time.",
    )
