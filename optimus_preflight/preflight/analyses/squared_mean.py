"""A residual averaged before it is squared (``LOSS_SQUARES_MEAN``).

A squared error is the mean of the squares, ``((pred - y) ** 2).mean()``; written
``(pred - y).mean() ** 2`` it is the square of the mean: positive and negative residuals
cancel, and the loss reaches 0 as soon as they balance, whatever each one is. A PINN's
``residual.mean().pow(2)`` trains the equation to hold on average only.

Fed every torch function call the loss spy sees during ``compute_loss`` (after the call):
per-point residuals (a sum or difference of at least 8 values that requires grad) are
remembered by identity (weak references, for the step only); a full reduction of one to a
0-dim tensor (``mean``/``sum`` without ``dim``) followed by a square (``pow(2)``, ``** 2``,
``square``) or ``abs`` is the finding, unless the same residual is also squared element by
element in the step (``mean(r ** 2) - mean(r) ** 2``, a variance).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

RESIDUAL_OPS = frozenset({"sub", "__sub__", "__rsub__", "rsub", "add", "__add__", "__radd__"})
FULL_REDUCTIONS = frozenset({"mean", "sum", "nanmean", "nansum"})
SQUARES = frozenset({"pow", "__pow__", "square", "abs", "__abs__"})
MIN_VALUES = 8


@dataclass
class SquaredMean:
    shape: tuple[int, ...]  # of the residual
    reduction: str  # "mean" or "sum"
    square: str  # the op that squared it


def _is_square(name: str, args: tuple) -> bool:
    if name in ("square", "abs", "__abs__"):
        return True
    return len(args) >= 2 and isinstance(args[1], (int, float)) and float(args[1]) == 2.0


class SquaredMeanWatch:
    """Feed it every torch function call (``observe``, after the call); ``found`` holds the
    first residual reduced before it was squared. ``start()`` before each ``compute_loss``."""

    def __init__(self) -> None:
        self._found: list[tuple[int, SquaredMean]] = []
        self._residuals: dict[int, weakref.ref] = {}
        self._reduced: dict[int, tuple[weakref.ref, int, tuple[int, ...], str]] = {}
        self._squared_whole: set[int] = set()  # residuals squared element by element

    def start(self) -> None:
        self._found.clear()
        self._residuals.clear()
        self._reduced.clear()
        self._squared_whole.clear()

    @property
    def found(self) -> SquaredMean | None:
        return next((found for source, found in self._found if source not in self._squared_whole), None)

    def _residual(self, tensor: Any) -> int | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        ref = self._residuals.get(id(tensor))
        return id(tensor) if ref is not None and ref() is tensor else None

    def observe(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        if not args or not isinstance(out, torch.Tensor):
            return
        if name in RESIDUAL_OPS and out.requires_grad and out.dim() >= 1 and out.numel() >= MIN_VALUES \
                and out.is_floating_point():
            self._residuals[id(out)] = weakref.ref(out)
            return
        if name in FULL_REDUCTIONS and out.dim() == 0 and "dim" not in kwargs and len(args) == 1:
            source = self._residual(args[0])
            if source is not None:
                self._reduced[id(out)] = (weakref.ref(out), source, tuple(args[0].shape), name)
            return
        if name in SQUARES and _is_square(name, args):
            source = self._residual(args[0])
            if source is not None:
                self._squared_whole.add(source)
                return
            entry = self._reduced.get(id(args[0]))
            if entry is not None and entry[0]() is args[0]:
                self._found.append((entry[1], SquaredMean(entry[2], entry[3], name.strip("_"))))


def squared_mean_finding(found: SquaredMean) -> Any:
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    return Finding(
        "LOSS_SQUARES_MEAN", "warning",
        f"the loss squares a residual after reducing it: a {found.shape} tensor of per-point differences (a "
        f"prediction minus its target, a PDE or ODE residual) is reduced by {found.reduction}() to one number and "
        f"then squared ({found.square}): the square of the {found.reduction}, not the {found.reduction} of the "
        "squares. "
        "Positive and negative residuals cancel before the square, so the loss reaches 0 as soon as they balance "
        "on average while every point may still be wrong (written residual.mean() ** 2 where (residual ** 2).mean() "
        "was meant)",
        "Square each residual first, then average: (residual ** 2).mean() (or F.mse_loss(pred, target)); keep a "
        "squared mean only as an extra constraint on a total (a conserved quantity) beside a per-point loss.",
    )
