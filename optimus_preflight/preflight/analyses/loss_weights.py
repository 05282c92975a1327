"""Per-sample weights applied to a loss that is already reduced (``LOSS_WEIGHTS_AFTER_MEAN``).

A criterion called with ``reduction='mean'`` (the default; ``'sum'`` alike) returns one
0-dim tensor, the batch's loss. Multiplying that very output by a ``(B,)`` vector of
per-sample weights and reducing the product, ``(criterion(out, y) * w).mean()``, gives
``loss * w.mean()``: one number scales the whole batch's gradient, and no sample is
weighted (a sample of weight 0 trains like the others). The weights were meant for the
per-sample losses of ``reduction='none'``.

Fed every torch function call the loss spy sees during ``compute_loss`` (through
``CriterionArgsWatch``): the 0-dim outputs of the criteria are remembered by identity (weak
references, for the step only); a multiplication of one of them by a tensor of the
batch's size (or of the criterion input's rows) is followed through the elementwise ops
that keep its shape; a ``mean``/``sum`` of it is the finding. A scalar weight (a 0-dim or
``(1,)`` factor) times the mean loss, and weights applied to ``reduction='none'`` losses,
are not recorded.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_findings import Finding

# The functional criteria (``nn.*Loss`` modules call them) whose reduced output is watched.
CRITERIA = frozenset({
    "cross_entropy", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "l1_loss",
    "smooth_l1_loss", "huber_loss", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "soft_margin_loss",
    "multilabel_soft_margin_loss", "multilabel_margin_loss", "multi_margin_loss", "hinge_embedding_loss",
    "cosine_embedding_loss", "margin_ranking_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
    "ctc_loss"})
MULTIPLY = frozenset({"mul", "__mul__", "__rmul__", "multiply"})
# Ops that keep the weighted (B,) product a per-sample vector on its way to the reduction
# (a division by w.sum(), a scale, a mask).
ELEMENTWISE = frozenset({"mul", "__mul__", "__rmul__", "multiply", "div", "__truediv__", "true_divide", "divide",
                         "add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "rsub", "neg", "__neg__",
                         "masked_fill", "where", "clone", "contiguous", "float", "to", "squeeze", "flatten",
                         "reshape", "view"})
REDUCTIONS = frozenset({"mean", "sum", "nanmean", "nansum"})


@dataclass
class WeightsAfterMean:
    criterion: str  # "cross_entropy"
    reduction: str  # the criterion's: "mean" or "sum"
    weights_shape: tuple[int, ...]
    reduced_by: str  # "mean" or "sum", of the weighted product
    w_min: float
    w_max: float
    zero_weights: int  # samples of weight exactly 0 (trained like the others)


def _rows(value: Any) -> int | None:
    return int(value.shape[0]) if isinstance(value, torch.Tensor) and value.dim() >= 1 else None


def _per_sample(tensor: Any, sizes: set[int]) -> bool:
    """A ``(B,)`` (or ``(B, 1)``) tensor, B one of ``sizes``."""
    return (isinstance(tensor, torch.Tensor) and tensor.dim() in (1, 2) and tensor.shape[0] in sizes
            and tensor.numel() == tensor.shape[0] and not tensor.is_complex())


class WeightsAfterMeanWatch:
    """Feed it every torch function call (``observe``, after the call); ``found`` holds the
    first weighted reduced loss. ``start(batch_rows)`` before each ``compute_loss``."""

    def __init__(self) -> None:
        self.found: WeightsAfterMean | None = None
        self._batch_rows: int | None = None
        # id -> (weak reference, criterion, reduction, the criterion input's rows)
        self._reduced: dict[int, tuple[weakref.ref, str, str, int | None]] = {}
        # id -> (weak reference, the finding it becomes once reduced)
        self._weighted: dict[int, tuple[weakref.ref, WeightsAfterMean]] = {}

    def start(self, batch_rows: int | None) -> None:
        self._batch_rows = batch_rows
        self._reduced.clear()
        self._weighted.clear()

    @staticmethod
    def _lookup(table: dict[int, tuple], tensor: Any) -> tuple | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        entry = table.get(id(tensor))
        return entry if entry is not None and entry[0]() is tensor else None

    def observe(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        if self.found is not None or not args:
            return
        if name in CRITERIA:
            if isinstance(out, torch.Tensor) and out.dim() == 0 and out.is_floating_point():
                reduction = kwargs.get("reduction", "mean")
                self._reduced[id(out)] = (weakref.ref(out), name, str(reduction), _rows(args[0]))
            return
        if name in REDUCTIONS:
            entry = self._lookup(self._weighted, args[0])
            if entry is not None:
                entry[1].reduced_by = name
                self.found = entry[1]
                self.start(self._batch_rows)  # nothing held past the finding
            return
        if name in MULTIPLY and len(args) >= 2 and isinstance(out, torch.Tensor):
            for loss, weights in ((args[0], args[1]), (args[1], args[0])):
                entry = self._lookup(self._reduced, loss)
                if entry is None:
                    continue
                _, criterion, reduction, input_rows = entry
                sizes = {size for size in (self._batch_rows, input_rows) if size is not None and size >= 2}
                if _per_sample(weights, sizes) and out.shape == weights.shape:
                    self._weighted[id(out)] = (weakref.ref(out), _describe(criterion, reduction, weights))
                    return
        if name in ELEMENTWISE and isinstance(out, torch.Tensor):
            for arg in args[:2]:
                entry = self._lookup(self._weighted, arg)
                if entry is not None and out.dim() in (1, 2) and out.numel() == arg.numel() and out.numel() >= 2:
                    self._weighted[id(out)] = (weakref.ref(out), entry[1])
                    return
                entry = self._lookup(self._reduced, arg)
                if entry is not None and out.dim() == 0:  # still the batch's loss: 0.5 * ce, ce + 0.1 * aux
                    self._reduced[id(out)] = (weakref.ref(out), *entry[1:])
                    return


def _describe(criterion: str, reduction: str, weights: torch.Tensor) -> WeightsAfterMean:
    with torch.no_grad():
        values = weights.detach().float()
        return WeightsAfterMean(criterion, reduction, tuple(weights.shape), "mean", float(values.min()),
                                float(values.max()), int((values == 0).sum()))


def weights_after_mean_finding(found: WeightsAfterMean) -> Finding:
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    rows = found.weights_shape[0]
    zeros = (f"; the {found.zero_weights} sample(s) of weight 0 are trained exactly like the others"
             if found.zero_weights else "")
    factor = "w.mean()" if found.reduced_by in ("mean", "nanmean") else "w.sum()"
    return Finding(
        "LOSS_WEIGHTS_AFTER_MEAN", "error",
        f"{found.criterion} runs with reduction='{found.reduction}' and returns the batch's loss as one 0-dim tensor, "
        f"which is then multiplied by a {found.weights_shape} tensor of per-sample weights (in [{found.w_min:.3g}, "
        f"{found.w_max:.3g}]) and {found.reduced_by}-reduced: that equals the batch loss times {factor}, one number "
        f"for all {rows} samples, so the weights scale the step but weight no sample{zeros}",
        f"Compute the per-sample losses first and weight those: criterion = nn.{_module_name(found.criterion)}"
        f"(reduction='none') (F.{found.criterion}(..., reduction='none')), then loss = (losses * w).sum() / w.sum() "
        "(a per-token loss: .view(B, -1).mean(1) per sample before weighting).",
    )


_MODULES = {"cross_entropy": "CrossEntropyLoss", "nll_loss": "NLLLoss", "binary_cross_entropy": "BCELoss",
            "binary_cross_entropy_with_logits": "BCEWithLogitsLoss", "mse_loss": "MSELoss", "l1_loss": "L1Loss",
            "smooth_l1_loss": "SmoothL1Loss", "huber_loss": "HuberLoss", "kl_div": "KLDivLoss",
            "poisson_nll_loss": "PoissonNLLLoss", "gaussian_nll_loss": "GaussianNLLLoss", "ctc_loss": "CTCLoss"}


def _module_name(criterion: str) -> str:
    return _MODULES.get(criterion, "".join(part.title() for part in criterion.split("_")).replace("Loss", "") + "Loss")
