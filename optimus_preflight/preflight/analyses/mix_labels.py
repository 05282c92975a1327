"""How much of each sample a mixed input holds, against how much its label weighs in the loss.

Mixup feeds ``lam * x + (1 - lam) * x[perm]`` and weighs ``lam * loss(y) + (1 - lam) *
loss(y[perm])``; CutMix pastes a box of ``x[perm]`` into ``x`` and weighs ``y`` by the share
of the image left outside the box. Both are one promise: the share of the input that comes
from sample ``i`` is the weight of label ``y_i``. Swapped weights (``(1 - lam) * loss(y)``),
or CutMix's ``lam`` taken as the box's area instead of ``1 -`` it, train each mixed image
towards the label of the sample it mostly is not.

Read from what one loss call does (``MixWatch``), whatever the code's names:
- a batch field gathered by a permutation of the batch (``x[perm]``, ``index_select``,
  ``x.flip(0)``, ``x.roll(1, 0)``) gives the partner ``x[perm]``;
- the model's input ``m``, where every value lies between ``x`` and ``x[perm]``: the
  input's share of ``x`` is the mean of ``(m - x[perm]) / (x - x[perm])`` where they differ
  (``lam`` for mixup, the area outside the box for CutMix);
- the label's share: the criteria whose target equals ``y`` and ``y[perm]``, weighted by
  the gradient of the returned loss with respect to each criterion's value (the factor the
  code multiplies it by); or one criterion's soft target holding both one-hot labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.loss_spy import BINARY_CRITERIA, CLASS_CRITERIA
from optimus_preflight.training.batches import leaves

# Criteria whose target names a class (or a soft distribution over classes).
LABEL_CRITERIA = {*CLASS_CRITERIA, *BINARY_CRITERIA, "kl_div"}
BETWEEN_SHARE = 0.95  # of the differing values, this share lies between x and x[perm]
DIFFERS = 1e-3  # |x - x[perm]| above this share of the field's scale counts as differing
MAX_TRACKED = 64  # permuted copies and criterion calls kept per loss call


@dataclass
class Criterion:
    name: str
    target: torch.Tensor
    value: torch.Tensor


@dataclass
class MixDraw:
    """One loss call: the input's share of ``x`` and the loss weight of ``y``."""

    input_share: float
    label_share: float


@dataclass
class MixWatch(TorchFunctionMode):
    fields: list[torch.Tensor]
    permuted: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # out id -> (out, source, perm)
    criteria: list[Criterion] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()
        self._field_ids = {id(t) for t in self.fields}
        self._batch = self.fields[0].shape[0] if self.fields else 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        try:
            self._observe(name, args, kwargs, out)
        except Exception:  # noqa: BLE001 - observing must never change the user's computation
            pass
        return out

    def _observe(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        if not args or not isinstance(out, torch.Tensor):
            return
        source = args[0]
        if name in LABEL_CRITERIA and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            if len(self.criteria) < MAX_TRACKED:
                self.criteria.append(Criterion(name, args[1].detach(), out))
            return
        if not isinstance(source, torch.Tensor) or id(source) not in self._field_ids or len(self.permuted) >= MAX_TRACKED:
            return
        perm = self._permutation(name, args, kwargs)
        if perm is not None:
            self.permuted[id(out)] = (out, source, perm)

    def _permutation(self, name: str, args: tuple, kwargs: dict) -> torch.Tensor | None:
        n = self._batch
        if name == "__getitem__" and len(args) > 1:
            index = args[1]
        elif name == "index_select" and (args[1] if len(args) > 1 else kwargs.get("dim")) == 0:
            index = args[2] if len(args) > 2 else kwargs.get("index")
        elif name == "flip":
            dims = args[1] if len(args) > 1 else kwargs.get("dims")
            index = torch.arange(n - 1, -1, -1) if tuple(dims if isinstance(dims, (list, tuple)) else [dims]) == (0,) else None
        elif name == "roll":
            shifts = args[1] if len(args) > 1 else kwargs.get("shifts")
            dims = args[2] if len(args) > 2 else kwargs.get("dims")
            index = torch.arange(n).roll(int(shifts), 0) if dims == 0 and isinstance(shifts, int) else None
        else:
            return None
        if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int64, torch.int32) or index.shape != (n,):
            return None
        index = index.detach().cpu().long()
        if not torch.equal(index.sort().values, torch.arange(n)) or torch.equal(index, torch.arange(n)):
            return None
        return index


def input_share(model_input: torch.Tensor, own: torch.Tensor, partner: torch.Tensor) -> float | None:
    """The mean share of ``own`` in ``model_input`` over the values where ``own`` and
    ``partner`` differ, when nearly all of them lie between the two; else None."""
    own, partner, mixed = own.detach().double(), partner.detach().double(), model_input.detach().double()
    gap = own - partner
    scale = float(gap.abs().max())
    if scale <= 0:
        return None
    differs = gap.abs() > DIFFERS * scale
    if int(differs.sum()) < 16:
        return None
    ratio = ((mixed - partner)[differs] / gap[differs])
    between = ((ratio >= -0.01) & (ratio <= 1.01)).double().mean()
    if float(between) < BETWEEN_SHARE:
        return None
    return float(ratio.clamp(0, 1).mean())


def label_share(criteria: list[Criterion], loss: torch.Tensor, labels: torch.Tensor,
                partner_labels: torch.Tensor) -> float | None:
    """The loss weight of ``labels`` over that of ``labels`` and ``partner_labels``."""
    own = [c for c in criteria if c.target.shape == labels.shape and torch.equal(c.target, labels)]
    other = [c for c in criteria if c.target.shape == labels.shape and torch.equal(c.target, partner_labels)]
    if own and other:
        values = [c.value for c in own + other]
        if not all(v.requires_grad for v in values):
            return None
        grads = torch.autograd.grad(loss, values, retain_graph=True, allow_unused=True)
        weights = [0.0 if g is None else float(g.double().sum()) for g in grads]
        w_own, w_other = sum(weights[: len(own)]), sum(weights[len(own):])
        total = w_own + w_other
        return w_own / total if total > 0 and w_own >= 0 and w_other >= 0 else None
    return _soft_target_share(criteria, labels, partner_labels)


def _soft_target_share(criteria: list[Criterion], labels: torch.Tensor, partner_labels: torch.Tensor) -> float | None:
    if labels.dim() != 1 or labels.is_floating_point():
        return None
    rows = labels != partner_labels
    if int(rows.sum()) < 2:
        return None
    for criterion in criteria:
        target = criterion.target
        if target.dim() != 2 or target.shape[0] != labels.shape[0] or not target.is_floating_point():
            continue
        if int(labels.max()) >= target.shape[1] or bool((target < 0).any()):
            continue
        own = target[rows].gather(1, labels[rows].long().unsqueeze(1)).squeeze(1).double()
        other = target[rows].gather(1, partner_labels[rows].long().unsqueeze(1)).squeeze(1).double()
        total = own + other
        if bool((total > 0.5).all()):
            return float((own / total).mean())
    return None


def mix_draw(model: nn.Module, batch: Any, call_loss: Any) -> MixDraw | None:
    """One loss call under a ``MixWatch``: the input's and the label's share of sample i."""
    fields = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() >= 1
              and leaf.layout == torch.strided]
    if len(fields) < 2:
        return None
    inputs: list[torch.Tensor] = []

    def record(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not inputs:
            inputs.extend(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    watch = MixWatch(fields)
    try:
        with watch:
            loss = call_loss()
    finally:
        handle.remove()
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return None
    for out, source, perm in watch.permuted.values():
        model_input = next((t for t in inputs if t.shape == source.shape and t.is_floating_point()), None)
        if model_input is None or not source.is_floating_point():
            continue
        share = input_share(model_input, source, out)
        if share is None:
            continue
        for labels in fields:
            if labels is source or labels.shape[0] != perm.shape[0] or labels.is_floating_point():
                continue
            partner = labels[perm.to(labels.device)]
            if torch.equal(partner, labels):
                continue
            weight = label_share(watch.criteria, loss, labels, partner)
            if weight is not None and math.isfinite(weight):
                return MixDraw(share, weight)
    return None
