"""Tensors that follow the trained weights by an exponential moving average, and their rate.

A mean teacher, a BYOL / MoCo momentum encoder or an EMA of the weights kept for evaluation
is a copy the optimizer does not hold, updated in place as ``e <- d * e + (1 - d) * p``.
Over a run of ``n`` updates it keeps ``d ** n`` of where it started: with ``d = 0.9999``
a 300-step run leaves 97% of the copy at its random initialisation, and whatever reads it
(the consistency target, the evaluated model, the negatives) stays random all run.

Read from what the step does, not from names: a fixed sample of every tensor outside the
optimizer (parameters and floating buffers of the model and of modules the loss function
holds) before and after each trial step, set against the same sample of every optimizer
parameter of its shape. A change that is, to a few percent, a fixed share ``1 - d`` of the
way from the copy to a parameter (as it was before or after the step) is an EMA update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from optimus_preflight.training.sharding import held_whole

SAMPLE = 4096  # values read per tensor: the fit needs few, a 10B model's tensors stay unread
MAX_RESIDUAL = 0.05  # the change is this close (relative norm) to a share of the way to a parameter
MIN_TENSORS = 1
ROUNDING_ULPS = 2.0


def _sample_index(numel: int) -> torch.Tensor | None:
    if numel < 2:
        return None
    return torch.linspace(0, numel - 1, min(numel, SAMPLE)).long()


def _read(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1)[index.to(tensor.device)].double().cpu()


@dataclass
class EmaFit:
    """One tensor outside the optimizer moving a share of the way to one parameter."""

    name: str
    rate: float  # 1 - decay, per update
    against: str  # "before" or "after" the optimizer's step


@dataclass
class EmaWatch:
    """Samples of the watched tensors and of the optimizer's parameters around trial steps."""

    watched: list[tuple[str, torch.Tensor, torch.Tensor]]  # (name, tensor, sample index)
    params: list[tuple[torch.Tensor, torch.Tensor]]  # (parameter, sample index)
    fits: list[list[EmaFit]] = field(default_factory=list)  # per step

    @classmethod
    def of(cls, modules: Iterable[tuple[str, nn.Module]], optimizer: torch.optim.Optimizer) -> EmaWatch:
        in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = [p for group in optimizer.param_groups for p in group["params"]]
        shapes = {tuple(p.shape) for p in params}
        watched: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        seen: set[int] = set()
        for prefix, module in modules:
            for name, tensor in _outside(module, in_optimizer):
                index = _sample_index(tensor.numel())
                if id(tensor) in seen or index is None or tuple(tensor.shape) not in shapes:
                    continue
                seen.add(id(tensor))
                watched.append((f"{prefix}{name}", tensor, index))
        samples = [(p, _sample_index(p.numel())) for p in params if _plain(p)]
        return cls(watched, [(p, i) for p, i in samples if i is not None])

    def _read_all(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return ([_read(t, i) for _, t, i in self.watched], [_read(p, i) for p, i in self.params])

    @contextmanager
    def step(self) -> Iterator[None]:
        """Wrap one trial step: the watched tensors' changes are fitted when it ends."""
        watched_before, params_before = self._read_all()
        yield
        watched_after, params_after = self._read_all()
        fits: list[EmaFit] = []
        for (name, tensor, _), before, after in zip(self.watched, watched_before, watched_after):
            change = after - before
            if not bool(change.abs().max() > 0):
                continue
            fit = _best_fit(name, tensor, before, change, self.params, params_before, params_after)
            if fit is not None:
                fits.append(fit)
        self.fits.append(fits)

    def rate(self) -> tuple[float, list[str]] | None:
        """(the median update share over every fitted tensor and step, names) or None."""
        rates = [fit.rate for step in self.fits for fit in step]
        names = list(dict.fromkeys(fit.name for step in self.fits for fit in step))
        if len(names) < MIN_TENSORS:
            return None
        return float(torch.tensor(rates).median()), names


def _plain(tensor: torch.Tensor) -> bool:
    """A floating tensor held whole: a sharded DTensor or a meta tensor is not read."""
    return tensor.is_floating_point() and held_whole(tensor)


def _outside(module: nn.Module, in_optimizer: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, param in module.named_parameters():
        if id(param) not in in_optimizer and _plain(param):
            yield name, param
    for name, buffer in module.named_buffers():
        # Normalisation statistics average the activations, not the weights; left out, a
        # CNN without an EMA copy costs no trial step.
        if _plain(buffer) and not name.endswith(("running_mean", "running_var")):
            yield name, buffer


def _best_fit(name: str, tensor: torch.Tensor, before: torch.Tensor, change: torch.Tensor,
              params: list[tuple[torch.Tensor, torch.Tensor]], params_before: list[torch.Tensor],
              params_after: list[torch.Tensor]) -> EmaFit | None:
    change_norm = float(change.norm())
    # An in-place update in the tensor's own precision rounds every value by up to an ulp:
    # with a decay of 0.9999 that is a good part of the change itself.
    rounding = ROUNDING_ULPS * torch.finfo(tensor.dtype).eps * float(before.norm())
    best: tuple[float, EmaFit] | None = None
    for (param, _), p_before, p_after in zip(params, params_before, params_after):
        if param.shape != tensor.shape or p_before.shape != before.shape:
            continue
        for against, target in (("before", p_before), ("after", p_after)):
            way = target - before
            length = float(way.dot(way))
            if length <= 0:
                continue
            share = float(change.dot(way)) / length
            residual = float((change - share * way).norm())
            explained = share * math.sqrt(length)
            if (0 < share < 1 and explained > rounding and residual <= MAX_RESIDUAL * change_norm + rounding
                    and (best is None or residual < best[0])):
                best = (residual, EmaFit(name, share, against))
    return best[1] if best else None
