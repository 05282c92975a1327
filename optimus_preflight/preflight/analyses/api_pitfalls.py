"""Torch calls whose defaults do something other than what the line reads as (pure recording).

Watched during the first step's ``compute_loss`` (the model's forward included), by the loss
spy:

- ``x.T`` on a 1-D tensor returns it unchanged (torch only warns): ``labels == labels.T``
  then compares elementwise and is all True, where a (B, B) same-label mask was meant.
- ``torch.meshgrid(xs, ys)`` without ``indexing`` is ``indexing='ij'``: the first grid varies
  along the rows, while NumPy's ``np.meshgrid`` (``'xy'``) gives the x grid varying along
  the columns; code ported from NumPy swaps x and y.
- ``cross_entropy(..., label_smoothing=0.9)``: the smoothing is the mass taken off the true
  class; a confidence (0.9) passed for it makes the targets nearly uniform.
- ``kl_div`` / ``nn.KLDivLoss`` with ``reduction='mean'`` (the default) divides by every
  element, classes included: the KL is ``classes`` times too small ('batchmean' is the KL).
- a regression criterion whose prediction is detached while its target requires grad: the
  stop-gradient on the wrong side (TD learning's bootstrap target), or swapped arguments.
- attention weights normalised over the wrong axis: a batched matmul whose operand comes
  straight out of a softmax taken over another dim than the one the matmul sums over
  (``softmax(q @ k.T, dim=1) @ v`` on (B, Tq, Tk) scores normalises over the queries, so
  each query's weights over the keys do not sum to 1).
- scores masked with 0 before a softmax: ``scores.masked_fill(pad, 0)`` or ``scores * mask``
  leaves the masked positions at score 0, which softmax still weights (e^0 is an average
  score's weight): the padding keeps its share of the attention. Masks fill with -inf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.box_corners import InvertedCorners, inverted_corners
from optimus_preflight.preflight.analyses.call_args import argument
from optimus_preflight.preflight.analyses.weight_masks import mask_keeps_smallest, mask_over_inputs, trained_mask

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_findings import Finding


TRANSPOSE = torch._C.TensorBase.__dict__.get("T")  # the .T property's descriptor: its __get__ reaches the mode


MASKED_FILLS = (torch.masked_fill, torch.Tensor.masked_fill, torch.Tensor.masked_fill_)
SOFTMAXES = (torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax)
LOG_SOFTMAXES = (torch.log_softmax, torch.Tensor.log_softmax, torch.nn.functional.log_softmax)
# Writes that keep one value per target index (the last, in no set order) where several sources share it.
OVERWRITING_SCATTERS = (torch.scatter, torch.Tensor.scatter, torch.Tensor.scatter_, torch.index_copy,
                        torch.Tensor.index_copy, torch.Tensor.index_copy_)
MILD_FILL = -1e3  # a fill above this leaves a masked score a weight softmax can see (-inf, -1e9 and finfo.min do not)
MATMULS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm)
REGRESSION = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")
# Criteria whose input and target play different parts (log-probabilities vs probabilities,
# logits vs labels): the prediction passed as the target is read as something else.
SWAPPABLE = ("kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits", "nll_loss", "poisson_nll_loss")
# Above this, label smoothing gives the true class less than half of the target's mass, (1 - s) + s / K:
# a keep-confidence (0.9) passed where the smoothing (0.1) was meant.
SMOOTHING_LIMIT = 0.5
UNIFORM_DRAWS, UNIFORM_MIN = ("rand", "rand_like"), 16  # a per-element noise tensor, not a scalar draw
DENSE_MAP, TINY, MOSTLY = 64, 1e-3, 0.75  # per-sample map size; a peak below TINY; the share of such maps
# Heatmaps centred off the map: peaks below OFF_MAP_PEAK on the border, in OFF_MAP_SHARE of the drawn maps.
OFF_MAP_PEAK, OFF_MAP_SHARE, OFF_MAP_BORDER, OFF_MAP_MIN_MAPS = 0.5, 0.3, 0.9, 4
SHORT_AXIS, LONG_AXIS = 4, 16  # a sort along a last dim this short, with another this long, sorts coordinates


@dataclass
class Pitfalls:
    transposed_1d: list[tuple[int, ...]] = field(default_factory=list)  # shapes of 1-D tensors given .T
    meshgrid_default: list[tuple[int, ...]] = field(default_factory=list)  # sizes of meshgrids without indexing
    label_smoothing: tuple[float, int] | None = None  # (label_smoothing, classes) of a cross_entropy above the limit
    kl_div_mean: tuple[int, ...] | None = None  # input shape of a kl_div with reduction='mean'
    detached_prediction: tuple[str, tuple[int, ...]] | None = None  # (criterion, shape): input detached, target not
    # (shape): a distillation kl_div whose target distribution (the teacher's) carries gradients too
    teacher_trained: tuple[int, ...] | None = None
    swapped_arguments: tuple[str, tuple[int, ...]] | None = None  # the same for a criterion whose two sides differ
    gather_rows: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (input, index) shapes of a gather(0) by ids
    einsum_private: tuple[str, str] | None = None  # (equation, the letters each summed inside one operand)
    sort_last: tuple[int, ...] | None = None  # shape of a tensor sorted along a short last dim
    vanishing_targets: tuple[tuple[int, ...], float, float] | None = None  # (shape, share of maps, largest value)
    off_map_targets: tuple[tuple[int, ...], float, float] | None = None  # (shape, share at the border, share zero)
    # (shape, the softmax's dim, the dim the matmul sums over) of attention weights normalised off-axis
    softmax_off_axis: tuple[tuple[int, ...], int, int] | None = None
    masked_with_zero: tuple[tuple[int, ...], str] | None = None  # (scores shape, how) of a mask filled with ~0
    uniform_noise_target: tuple[str, str, tuple[int, ...]] | None = None  # (criterion, draw, shape): see after()
    inverted_corners: InvertedCorners | None = None  # box targets read as corners that are (x, y, w, h)
    kl_div_probabilities: tuple[int, ...] | None = None  # input shape of a kl_div given probabilities, not logs
    # (product shape, the softmax's dim and its size, the summed dim and its size) of (p * values).sum(dim)
    weighted_sum_off_axis: tuple[tuple[int, ...], int, int, int, int] | None = None
    # (shape, smallest, largest value) of raw scores a soft Dice/IoU multiplies with a 0/1 mask and sums alone
    overlap_on_raw_scores: tuple[tuple[int, ...], float, float] | None = None
    embedding_dim_pooled: tuple[str, tuple[int, ...]] | None = None  # (reduction, shape) over an embedding's vectors
    # (shape, whether both sides are one distribution) of a kl_div with no gradient on either side
    kl_div_constant: tuple[tuple[int, ...], bool] | None = None
    # a trained Parameter minus itself (an anchor dict holding the live parameters): a penalty of 0
    parameter_minus_itself: tuple[int, ...] | None = None
    # kl_div whose detached target is the input's own distribution: the 'teacher' is the trained model
    kl_div_self: tuple[int, ...] | None = None
    # (function, shape, dim) of a softmax / log_softmax over a dim of size 1: constant 1 (or 0)
    softmax_of_one: tuple[str, tuple[int, ...], int] | None = None
    # (shape, largest value) of soft targets in [0, 1] compared == 1 where none is: an empty positive mask
    peak_below_one: tuple[tuple[int, ...], float] | None = None
    # (agreement of the soft targets' top class with the hard labels, after the best renumbering,
    # the renumbering) where a distillation's soft targets name the classes in another order
    soft_class_order: tuple[float, float, dict[int, int]] | None = None
    # (x1 shape, x2 shape, dim) of a cosine_similarity reducing an axis along which one input is broadcast
    cosine_over_broadcast: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    # (function, shape of the index, share of targets written twice or more) of a scatter / index_copy
    # that overwrites: messages sent to one node keep only one of them
    scatter_overwrites: tuple[str, tuple[int, ...], float] | None = None
    # (function, shape, dim) of a softmax over one spatial axis of a (B, C, ...) convolution output
    softmax_spatial_axis: tuple[str, tuple[int, ...], int] | None = None
    # (weight shape, share pruned) of a trained weight times a 0/1 mask that zeroes its largest magnitudes
    mask_keeps_smallest: tuple[tuple[int, ...], float] | None = None
    # (shape, share of zeros) of a trained 0/1 Parameter multiplied into another trained weight: a mask trained
    mask_is_parameter: tuple[tuple[int, ...], float] | None = None
    # (weight shape, columns zeroed) of an (out, in) weight times a 0/1 mask over its input columns
    mask_over_inputs: tuple[tuple[int, ...], int] | None = None
    # (shape, distance op) of cross_entropy logits that are distances, not negated: the positive is pushed away
    distance_logits: tuple[tuple[int, ...], str] | None = None
    # (shape, share of rows) of a min over a (B, B) distance table's rows that picks each row's own 0 diagonal
    self_as_negative: tuple[tuple[int, ...], float] | None = None
    # (logits shape) of cross_entropy labels arange(B) on cat([l_pos (B, 1), l_neg (B, K)]) logits
    positive_first_arange: tuple[int, ...] | None = None
    # (criterion, part sizes, label) of binary targets cat from parts that all hold one label, beside scores cat
    # from parts of the same sizes: positives and sampled negatives labelled alike
    one_label_parts: tuple[str, tuple[int, ...], float] | None = None
    # (reduction, shape) of a squared / absolute difference of two (B, D) tensors reduced over dim 0, the batch
    distance_over_batch: tuple[str, tuple[int, ...]] | None = None
    # (weight value, share of positives) of a BCE given one constant weight= and no pos_weight on imbalanced targets
    weight_not_pos_weight: tuple[float, float] | None = None
    # one prediction regressed onto two targets that agree in order but not in units (see two_scales)
    two_scales: TwoScales | None = None


ORDER_MIN_ROWS = 16
# Two regression targets of one prediction: ranked alike (Pearson r at least this) ...
SCALES_AGREE = 0.8
# ... while their means lie this many of the larger std apart, or one's std is this many times the other's.
SCALES_APART, SCALES_RATIO = 3.0, 3.0


@dataclass(frozen=True)
class TwoScales:
    criterion: str
    shape: tuple[int, ...]
    correlation: float
    first: tuple[float, float]  # (mean, std) of the first target
    second: tuple[float, float]  # ... of the second


# Autograd nodes a score passes through unchanged in order: scaling by a temperature, copies, views.
ORDER_KEEPING = {"DivBackward0", "MulBackward0", "CloneBackward0", "ToCopyBackward0", "AliasBackward0",
                 "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "ExpandBackward0"}
# torch.cdist computes through a matrix product past 25 rows (EuclideanDist), directly below.
DISTANCE_NODES = {"CdistBackward0": "torch.cdist", "EuclideanDistBackward0": "torch.cdist",
                  "PairwiseDistanceBackward0": "F.pairwise_distance"}


def distance_source(tensor: Any) -> str | None:
    """The distance op ``tensor`` is a scaled copy of (torch.cdist, the norm of a difference), or
    None; a negation (or any other op) on the way stops the walk (pure on the graph)."""
    node = getattr(tensor, "grad_fn", None)
    for _ in range(8):
        if node is None:
            return None
        name = type(node).__name__
        if name in DISTANCE_NODES:
            return DISTANCE_NODES[name]
        if name in ("LinalgVectorNormBackward0", "NormBackward1"):
            inner = [type(n).__name__ for n, _ in node.next_functions if n is not None]
            return "the norm of a difference" if inner and inner[0] == "SubBackward0" else None
        if name not in ORDER_KEEPING:
            return None
        node = next((n for n, _ in node.next_functions if n is not None), None)
    return None


SELF_NEGATIVE_ROWS = 0.9


def self_as_negative(table: Any, values: Any) -> tuple[tuple[int, ...], float] | None:
    """(shape, share of rows) where a row-wise min over a (B, B) table whose diagonal is 0 and whose
    other entries are positive returns the diagonal: batch-hard mining whose 'hardest negative'
    is the anchor itself, distance 0, because the diagonal (and same-class entries) were not
    masked (pure)."""
    if not (isinstance(table, torch.Tensor) and isinstance(values, torch.Tensor)) or table.dim() != 2 \
            or table.shape[0] != table.shape[1] or table.shape[0] < ORDER_MIN_ROWS or values.shape != table.shape[:1]:
        return None
    t = table.detach().float()
    diagonal = t.diagonal()
    off = t[~torch.eye(t.shape[0], dtype=torch.bool, device=t.device)]
    scale = float(off.abs().median()) if off.numel() else 0.0
    # cdist through a matrix product leaves ~1e-3 on a diagonal that is 0 in exact arithmetic
    tolerance = 1e-2 * scale
    if scale <= 0 or float(diagonal.abs().max()) > tolerance or float((off > tolerance).float().mean()) < 0.9:
        return None
    picked = float((values.detach().float().abs() <= tolerance).float().mean())
    return (tuple(table.shape), picked) if picked >= SELF_NEGATIVE_ROWS else None


RARE_POSITIVES = 0.35  # of the 0/1 targets: an imbalance a user reweights


def weight_not_pos_weight(target: Any, weight: Any, pos_weight: Any) -> tuple[float, float] | None:
    """(weight, share of positives) where binary_cross_entropy_with_logits gets one constant
    ``weight`` other than 1 and no ``pos_weight`` on 0/1 targets with rare positives: the weight
    scales every term, so the imbalance it was meant to correct stays (pure)."""
    if pos_weight is not None or not isinstance(weight, torch.Tensor) or not isinstance(target, torch.Tensor) \
            or not weight.numel() or not target.numel():
        return None
    values = weight.detach().float().reshape(-1)
    value = float(values[0])
    if not bool((values == value).all()) or abs(value - 1) < 0.5:
        return None
    labels = target.detach()
    if not bool(((labels == 0) | (labels == 1)).all()):
        return None
    positives = float(labels.float().mean())
    return (value, positives) if 0 < positives <= RARE_POSITIVES else None


def two_scales(criterion: str, first: torch.Tensor, second: torch.Tensor) -> TwoScales | None:
    """Two targets of one prediction that rank the samples alike but sit on different scales: one is
    an affine image of the other (a teacher fit on z-scored targets next to raw labels), so the
    prediction is pulled halfway between two unit systems (pure)."""
    a, b = first.detach().reshape(-1).double(), second.detach().reshape(-1).double()
    if a.numel() != b.numel() or a.numel() < ORDER_MIN_ROWS or not (a.isfinite().all() and b.isfinite().all()):
        return None
    sa, sb = float(a.std()), float(b.std())
    if min(sa, sb) <= 1e-8:
        return None
    r = float(((a - a.mean()) * (b - b.mean())).mean() / (a.std(unbiased=False) * b.std(unbiased=False)))
    ma, mb = float(a.mean()), float(b.mean())
    apart = abs(ma - mb) >= SCALES_APART * max(sa, sb)
    if r < SCALES_AGREE or not (apart or max(sa, sb) >= SCALES_RATIO * min(sa, sb)):
        return None
    return TwoScales(criterion, tuple(first.shape), r, (ma, sa), (mb, sb))
ORDER_AGREES = 0.8  # of the rows: the teacher's top class, renumbered, is the label
ORDER_GAIN = 0.3  # ... this much more often than as given


def class_order(soft_top: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, dict[int, int]] | None:
    """(agreement as given, agreement renumbered, the renumbering teacher class -> label) when
    renumbering the soft targets' top classes one to one makes them agree with the labels (pure)."""
    classes = int(max(int(soft_top.max()), int(labels.max()))) + 1
    if int(labels.min()) < 0 or classes > 256:
        return None
    counts = torch.zeros(classes, classes)
    counts.index_put_((soft_top.long(), labels.long()), torch.ones(len(labels)), accumulate=True)
    mapping = {int(t): int(counts[t].argmax()) for t in torch.unique(soft_top).tolist()}
    if len(set(mapping.values())) != len(mapping) or all(t == c for t, c in mapping.items()):
        return None
    as_given = float((soft_top == labels).float().mean())
    renumbered = float(sum(float(counts[t, c]) for t, c in mapping.items())) / len(labels)
    if renumbered < ORDER_AGREES or renumbered < as_given + ORDER_GAIN:
        return None
    return as_given, renumbered, {t: c for t, c in mapping.items() if t != c}


def softmax_of_one(name: str, args: tuple, kwargs: dict) -> tuple[str, tuple[int, ...], int] | None:
    """(function, shape, dim) when a softmax / log_softmax runs over a dim of size 1 of a tensor of
    several values: every output is exactly 1 (0 for log_softmax), whatever the input (pure): a
    single-logit binary head's 'probabilities' taken with softmax instead of sigmoid."""
    tensor, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim", None)
    if not isinstance(tensor, torch.Tensor) or not isinstance(dim, int) or tensor.dim() == 0 or tensor.numel() < 2:
        return None
    if not -tensor.dim() <= dim < tensor.dim() or tensor.shape[dim] != 1:
        return None
    return name, tuple(tensor.shape), dim


PEAK_MIN_VALUES = 64  # of a soft target map before its comparison with 1 is read


def peak_below_one(args: tuple) -> tuple[tuple[int, ...], float] | None:
    """(shape, largest value) when ``target == 1`` (``target.eq(1)``) runs on soft targets in [0, 1]
    that come close to 1 but never reach it, so it matches nothing: Gaussian heatmaps drawn at
    sub-pixel centres peak below 1, and positives picked by ``gt.eq(1)`` are none (pure)."""
    if len(args) < 2:
        return None
    target, other = args[0], args[1]
    one = other == 1 if isinstance(other, (int, float)) else (
        isinstance(other, torch.Tensor) and other.numel() == 1 and float(other) == 1.0)
    if not one or not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.requires_grad \
            or target.numel() < PEAK_MIN_VALUES:
        return None
    low, high = float(target.min()), float(target.max())
    if low < 0 or not 0.5 <= high < 1.0:
        return None
    return tuple(target.shape), high


class PitfallWatch:
    """Fed every torch function call the loss spy sees (``LossSpy.__torch_function__``)."""

    def __init__(self) -> None:
        self.found = Pitfalls()
        # The autograd nodes of tensors given masked_fill with a value that is no -inf (held, so
        # their ids stay theirs while the step runs).
        self._filled_mildly: list[Any] = []
        self._uniform_draws: list[tuple[str, torch.Tensor]] = []  # held for the step only
        self._masked_scores: list[torch.Tensor] = []  # raw scores multiplied with a 0/1 mask, held for the step
        # Ids of the parameters the step's ops read with and without grad: one module run both ways is
        # the trained model also serving as its own 'old model' or teacher (an alias, not a copy).
        self._params_with_grad: set[int] = set()
        self._params_without_grad: set[int] = set()
        self._soft_top: torch.Tensor | None = None  # the top class of a kl_div's target rows, (B,)
        self._hard_labels: torch.Tensor | None = None  # a cross_entropy's class ids, (B,)
        # (prediction, target) of the step's first regression criterion whose prediction is trained
        self._regressed: tuple[torch.Tensor, torch.Tensor] | None = None
        self._row_minimum: Any = None  # the table a row-wise min is being taken of, until after()
        # cat([l_pos (B, 1), l_neg (B, K)], dim=1) results and their scalings by a temperature
        self._positive_first_logits: list[torch.Tensor] = []
        self._follow_positive_first = False  # the call running makes (or scales) positive-first logits
        # (tensor, part sizes, the one label of every part or None) of the step's cat(dim=0) results
        self._cat_parts: list[tuple[torch.Tensor, tuple[int, ...], float | None]] = []
        self._pending_parts: tuple[tuple[int, ...], float | None] | None = None

    def after(self, name: str, out: Any) -> None:
        """Keep the tensors drawn uniform on [0, 1) in the step (torch.rand, rand_like), and follow the
        calls whose result the readings above need (a row minimum, positive-first logits scaled)."""
        if self._row_minimum is not None:
            values = out[0] if isinstance(out, tuple) else out
            self.found.self_as_negative = self_as_negative(self._row_minimum, values)
            self._row_minimum = None
        if self._pending_parts is not None and isinstance(out, torch.Tensor):
            self._cat_parts.append((out, *self._pending_parts))
            self._pending_parts = None
        if self._follow_positive_first and isinstance(out, torch.Tensor):
            self._positive_first_logits.append(out)
        self._follow_positive_first = False
        if name in UNIFORM_DRAWS and isinstance(out, torch.Tensor) and out.is_floating_point() \
                and out.numel() >= UNIFORM_MIN and len(self._uniform_draws) < 8:
            self._uniform_draws.append((name, out))

    def release(self) -> None:
        self._uniform_draws.clear()
        self._positive_first_logits.clear()
        self._cat_parts.clear()
        self._regressed = None
        self._masked_scores.clear()

    def observe(self, func: Any, args: tuple, kwargs: dict) -> None:
        for arg in args[:3]:
            if isinstance(arg, torch.nn.Parameter):
                (self._params_with_grad if torch.is_grad_enabled() else self._params_without_grad).add(id(arg))
        name = getattr(func, "__name__", "")
        if name in ("sub", "__sub__"):
            if self.found.inverted_corners is None:
                self.found.inverted_corners = inverted_corners(name, args)
            if self.found.parameter_minus_itself is None and len(args) >= 2 and args[0] is args[1] \
                    and isinstance(args[0], torch.nn.Parameter) and args[0].requires_grad:
                self.found.parameter_minus_itself = tuple(args[0].shape)
        elif self.found.softmax_of_one is None and name in ("softmax", "log_softmax"):
            self.found.softmax_of_one = softmax_of_one(name, args, kwargs)
        elif self.found.peak_below_one is None and name in ("eq", "__eq__"):
            self.found.peak_below_one = peak_below_one(args)
        elif name == "cat":
            self._positive_first(args, kwargs)
            self._parts(args, kwargs)
        elif name in ("min", "amin") and self.found.self_as_negative is None and args \
                and isinstance(dim := argument(args, kwargs, 1, "dim"), int) and dim in (1, -1):
            self._row_minimum = args[0]
        if self._positive_first_logits and name in ("div", "__truediv__", "mul", "__mul__", "__rmul__") and args \
                and any(a is t for a in args[:2] for t in self._positive_first_logits):
            self._follow_positive_first = True
        if name in ("mul", "__mul__", "__rmul__") and len(args) >= 2:
            self._weight_masks(args[0], args[1])
        if self.found.overlap_on_raw_scores is None:
            self._overlap_terms(name, args)
        if getattr(func, "__self__", None) is TRANSPOSE:
            tensor = args[0] if args else None
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 1 and len(self.found.transposed_1d) < 4:
                self.found.transposed_1d.append(tuple(tensor.shape))
        elif func is torch.meshgrid and kwargs.get("indexing") is None and len(self.found.meshgrid_default) < 4:
            tensors = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            self.found.meshgrid_default.append(tuple(t.numel() for t in tensors if isinstance(t, torch.Tensor)))
        elif func is torch.cosine_similarity and self.found.cosine_over_broadcast is None:
            self.found.cosine_over_broadcast = cosine_over_broadcast(args, kwargs)
        elif func in (torch.gather, torch.Tensor.gather):
            self._gather(args, kwargs)
        elif func in (torch.sum, torch.Tensor.sum) and self.found.weighted_sum_off_axis is None:
            self._weighted_sum(args, kwargs)
            self._embedding_pooled("sum", args, kwargs)
            self._distance_over_batch("sum", args, kwargs)
        elif func in (torch.mean, torch.Tensor.mean, torch.amax, torch.Tensor.amax):
            self._embedding_pooled(getattr(func, "__name__", "mean"), args, kwargs)
            self._distance_over_batch(getattr(func, "__name__", "mean"), args, kwargs)
        elif func in MATMULS and self.found.softmax_off_axis is None:
            self._matmul(args)
        elif func in MASKED_FILLS:
            self._masked_fill(args, kwargs)
        elif func in SOFTMAXES and self.found.masked_with_zero is None:
            self._masked_softmax(args, kwargs)
        if func in OVERWRITING_SCATTERS and self.found.scatter_overwrites is None:
            self.found.scatter_overwrites = scatter_overwrites(func, args, kwargs)
        if func in SOFTMAXES + LOG_SOFTMAXES and self.found.softmax_spatial_axis is None:
            self.found.softmax_spatial_axis = softmax_spatial_axis(func, args, kwargs)
        elif func is torch.einsum and self.found.einsum_private is None:
            self._einsum(args)
        elif func in (torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort) and self.found.sort_last is None:
            self._sort(args, kwargs)
        else:
            self._criterion(getattr(func, "__name__", ""), args, kwargs)

    def _matmul(self, args: tuple) -> None:
        """An operand of a batched matmul that is a softmax's output, normalised over another
        dim than the one the product sums over (the last of the left operand, the second to
        last of the right one)."""
        for operand, summed in zip(args[:2], (-1, -2), strict=False):
            if not isinstance(operand, torch.Tensor) or operand.dim() < 3 or operand.shape[summed] < 2:
                continue
            node = operand.grad_fn
            if type(node).__name__ != "SoftmaxBackward0":
                continue
            try:
                dim = node._saved_dim
            except (AttributeError, RuntimeError):
                continue
            dim = (dim - 2**64 if dim >= 2**63 else dim) % operand.dim()
            # dim 0 is the batch: mixing samples is step.sample_mixing's finding.
            if dim not in (0, summed % operand.dim()) and operand.shape[dim] >= 2:
                self.found.softmax_off_axis = (tuple(operand.shape), dim, summed % operand.dim())
                return

    def _overlap_terms(self, name: str, args: tuple) -> None:
        """A soft Dice / IoU on raw scores: the model's output with negative values (no sigmoid or
        softmax in front) multiplied with a 0/1 mask of its size, and the same output summed alone
        (the denominator's sum(p))."""
        if name in ("mul", "__mul__", "__rmul__") and len(args) >= 2:
            for scores, mask in ((args[0], args[1]), (args[1], args[0])):
                if _raw_scores(scores) and isinstance(mask, torch.Tensor) and not mask.requires_grad \
                        and mask.numel() == scores.numel() and mask.numel() >= UNIFORM_MIN \
                        and bool(((mask == 0) | (mask == 1)).all()) and bool((mask == 1).any()) \
                        and len(self._masked_scores) < 4:
                    self._masked_scores.append(scores)
        elif name == "sum" and args and any(args[0] is held for held in self._masked_scores):
            scores = args[0].detach()
            self.found.overlap_on_raw_scores = (tuple(scores.shape), float(scores.min()), float(scores.max()))

    def _distance_over_batch(self, name: str, args: tuple, kwargs: dict) -> None:
        """(a - p).pow(2).sum(0): a distance between two (B, D) embeddings reduced over dim 0, the
        batch, which gives one value per embedding dimension instead of one per sample."""
        inputs, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim")
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if self.found.distance_over_batch is not None or not isinstance(inputs, torch.Tensor) \
                or not isinstance(dim, int) or dim not in (0, -2) or inputs.dim() != 2 or not inputs.requires_grad \
                or inputs.shape[0] < ORDER_MIN_ROWS or inputs.shape[1] < 2 or inputs.shape[0] == inputs.shape[1]:
            return
        node = inputs.grad_fn
        kind = type(node).__name__
        inner = [n for n, _ in node.next_functions] if node is not None else []
        if kind == "MulBackward0" and not (len(inner) == 2 and inner[0] is inner[1]):
            return  # (a - p) * (a - p) squares a difference; a scaled term (0.5 * (...)) does not
        if kind not in ("PowBackward0", "AbsBackward0", "MulBackward0") or not inner \
                or type(inner[0]).__name__ != "SubBackward0":
            return
        # Two tensors that carry gradients on both sides of the difference: embeddings, not x - 1
        if all(n is not None for n, _ in inner[0].next_functions[:2]):
            self.found.distance_over_batch = (name, tuple(inputs.shape))

    def _embedding_pooled(self, name: str, args: tuple, kwargs: dict) -> None:
        """A (B, T, E) embedding lookup reduced over its last axis: each token's vector collapsed
        to one number where the tokens were to be pooled (dim=1). Runs silently when T == E."""
        inputs, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim")
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if self.found.embedding_dim_pooled is not None or not isinstance(inputs, torch.Tensor) \
                or not isinstance(dim, int) or inputs.dim() != 3 or inputs.shape[-1] < 4 \
                or type(inputs.grad_fn).__name__ != "EmbeddingBackward0":
            return
        if dim % 3 == 2:
            self.found.embedding_dim_pooled = (name, tuple(inputs.shape))

    def _weighted_sum(self, args: tuple, kwargs: dict) -> None:
        """(p * values).sum(dim) where p comes straight out of a softmax over another dim: the
        weights sum to 1 over an axis the sum does not run over (a soft-argmax whose softmax
        runs across the keypoints instead of each heatmap's pixels)."""
        product, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim")
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if not isinstance(product, torch.Tensor) or not isinstance(dim, int) or product.dim() < 2 \
                or type(product.grad_fn).__name__ != "MulBackward0":
            return
        summed = dim % product.dim()
        for node, _ in product.grad_fn.next_functions:
            if type(node).__name__ != "SoftmaxBackward0":
                continue
            try:
                softmax_dim, result = node._saved_dim, node._saved_result
            except (AttributeError, RuntimeError):
                continue
            softmax_dim = (softmax_dim - 2**64 if softmax_dim >= 2**63 else softmax_dim) % result.dim()
            softmax_dim += product.dim() - result.dim()  # broadcast adds leading dims
            if softmax_dim not in (0, summed) and result.shape[softmax_dim - (product.dim() - result.dim())] >= 2 \
                    and product.shape[summed] >= 2:
                self.found.weighted_sum_off_axis = (tuple(product.shape), softmax_dim, int(product.shape[softmax_dim]),
                                                    summed, int(product.shape[summed]))
                return

    def _masked_fill(self, args: tuple, kwargs: dict) -> None:
        inputs, value = argument(args, kwargs, 0, "input"), argument(args, kwargs, 2, "value")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value)
        if isinstance(inputs, torch.Tensor) and inputs.grad_fn is not None and isinstance(value, (int, float)) \
                and value > MILD_FILL and len(self._filled_mildly) < 16:
            self._filled_mildly.append(inputs.grad_fn)

    def _masked_softmax(self, args: tuple, kwargs: dict) -> None:
        """A softmax over scores masked with 0: masked_fill(mask, 0) just before it, or a
        multiplication by a constant 0/1 mask."""
        scores = argument(args, kwargs, 0, "input")
        if not isinstance(scores, torch.Tensor) or scores.dim() < 2 or scores.grad_fn is None:
            return
        node = scores.grad_fn
        name = type(node).__name__
        inner = next((n for n, _ in getattr(node, "next_functions", ()) if n is not None), None)
        if name == "MaskedFillBackward0" and any(inner is filled for filled in self._filled_mildly):
            self.found.masked_with_zero = (tuple(scores.shape), "masked_fill(mask, 0)")
        elif name == "MulBackward0":
            for attribute in ("_saved_other", "_saved_self"):
                try:
                    factor = getattr(node, attribute, None)
                except RuntimeError:
                    continue
                if isinstance(factor, torch.Tensor) and not factor.requires_grad and factor.numel() > 1 \
                        and factor.shape[-1] == scores.shape[-1] and bool(((factor == 0) | (factor == 1)).all()) \
                        and bool((factor == 0).any()):
                    self.found.masked_with_zero = (tuple(scores.shape), "scores * mask")
                    return

    def _einsum(self, args: tuple) -> None:
        """Two or more operands that each have an axis no other operand and not the output
        names: each is summed on its own, sum(u) * sum(v), where a shared letter (a dot
        product) was meant."""
        if not args or not isinstance(args[0], str) or "->" not in args[0] or "." in args[0]:
            return
        inputs, output = args[0].replace(" ", "").split("->")
        operands = inputs.split(",")
        if len(operands) < 2:
            return
        private = []
        for index, operand in enumerate(operands):
            others = "".join(o for i, o in enumerate(operands) if i != index) + output
            private.append("".join(letter for letter in operand if letter not in others))
        if sum(bool(letters) for letters in private) >= 2:
            self.found.einsum_private = (args[0], ", ".join(letters for letters in private if letters))

    def _sort(self, args: tuple, kwargs: dict) -> None:
        """A sort along a last dim of 4 or fewer (coordinates, channels) while another
        non-batch dim is long: torch.sort's default dim=-1 orders the values inside each point."""
        inputs, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim", -1)
        # Data, not what the model computes: sorting a router's (B, T, experts) logits is routing.
        if not isinstance(inputs, torch.Tensor) or not isinstance(dim, int) or inputs.dim() < 3 or inputs.requires_grad:
            return
        if dim in (-1, inputs.dim() - 1) and inputs.shape[-1] <= SHORT_AXIS and max(inputs.shape[1:-1]) >= LONG_AXIS:
            self.found.sort_last = tuple(inputs.shape)

    def _gather(self, args: tuple, kwargs: dict) -> None:
        inputs, dim, index = (argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim"),
                              argument(args, kwargs, 2, "index"))
        if self.found.gather_rows is not None or dim != 0 or not isinstance(inputs, torch.Tensor) \
                or not isinstance(index, torch.Tensor) or inputs.dim() != 2 or not inputs.requires_grad:
            return
        rows, columns = inputs.shape
        # Each of the B outputs reads row index[b]; ids below the column count, which is under half
        # the rows, are per-sample column ids (actions, classes): only the first rows are ever read.
        if index.dim() == 2 and index.shape[0] == rows and index.numel() and columns < rows / 2 \
                and int(index.max()) < columns and int(index.min()) >= 0:
            self.found.gather_rows = (tuple(inputs.shape), tuple(index.shape))

    def _class_order(self) -> None:
        """A teacher's soft targets whose top class agrees with the batch's hard labels far less
        than after one renumbering of the classes: the teacher's outputs are in another class order."""
        if self.found.soft_class_order is not None or self._soft_top is None or self._hard_labels is None \
                or len(self._soft_top) != len(self._hard_labels) or len(self._hard_labels) < ORDER_MIN_ROWS:
            return
        found = class_order(self._soft_top, self._hard_labels)
        if found is not None:
            self.found.soft_class_order = found

    def _criterion(self, name: str, args: tuple, kwargs: dict) -> None:
        found = self.found
        inputs = argument(args, kwargs, 0, "input")
        if not isinstance(inputs, torch.Tensor):
            return
        if name == "cross_entropy" and self._hard_labels is None:
            labels = argument(args, kwargs, 1, "target")
            if isinstance(labels, torch.Tensor) and labels.dim() == 1 and not labels.is_floating_point() \
                    and inputs.dim() == 2 and len(labels) == len(inputs):
                self._hard_labels = labels.detach().cpu()
                self._class_order()
        elif name == "kl_div" and self._soft_top is None:
            target = argument(args, kwargs, 1, "target")
            if isinstance(target, torch.Tensor) and target.dim() == 2 and target.is_floating_point() \
                    and target.shape[1] >= 3:
                self._soft_top = target.detach().float().argmax(dim=1).cpu()
                self._class_order()
        if name == "cross_entropy" and inputs.dim() == 2 and inputs.requires_grad:
            target = argument(args, kwargs, 1, "target")
            if found.distance_logits is None and (source := distance_source(inputs)) is not None:
                found.distance_logits = (tuple(inputs.shape), source)
            if found.positive_first_arange is None and isinstance(target, torch.Tensor) and target.dim() == 1 \
                    and not target.is_floating_point() and len(target) == inputs.shape[0] \
                    and any(inputs is t for t in self._positive_first_logits) \
                    and torch.equal(target.cpu(), torch.arange(len(target))):
                found.positive_first_arange = tuple(inputs.shape)
        if name == "cross_entropy" and found.label_smoothing is None:
            smoothing = argument(args, kwargs, 7, "label_smoothing", 0.0)
            if isinstance(smoothing, (int, float)) and smoothing > SMOOTHING_LIMIT and inputs.dim() >= 2:
                found.label_smoothing = (float(smoothing), int(inputs.shape[1]))
        elif name == "kl_div":
            if found.kl_div_mean is None and argument(args, kwargs, 4, "reduction", "mean") == "mean" \
                    and inputs.dim() >= 2 and inputs.shape[-1] >= 2:
                found.kl_div_mean = tuple(inputs.shape)
            if found.kl_div_probabilities is None and is_distribution(inputs):
                found.kl_div_probabilities = tuple(inputs.shape)
            target = argument(args, kwargs, 1, "target")
            if found.kl_div_constant is None and torch.is_grad_enabled() and isinstance(target, torch.Tensor) \
                    and not inputs.requires_grad and not target.requires_grad and inputs.shape == target.shape:
                log_target = bool(argument(args, kwargs, 5, "log_target", False))
                probabilities = target.float() if not log_target else target.float().exp()
                same = bool(torch.allclose(inputs.float().exp(), probabilities, atol=1e-4, rtol=1e-3))
                found.kl_div_constant = (tuple(inputs.shape), same)
            elif found.kl_div_self is None and torch.is_grad_enabled() and isinstance(target, torch.Tensor) \
                    and inputs.requires_grad and not target.requires_grad and inputs.shape == target.shape \
                    and inputs.numel() >= 8:
                log_target = bool(argument(args, kwargs, 5, "log_target", False))
                probabilities = target.float() if not log_target else target.float().exp()
                if self._params_with_grad & self._params_without_grad and \
                        bool(torch.allclose(inputs.detach().float().exp(), probabilities, atol=1e-6, rtol=1e-5)):
                    found.kl_div_self = tuple(inputs.shape)
        if name in REGRESSION and found.detached_prediction is None and torch.is_grad_enabled():
            target = argument(args, kwargs, 1, "target")
            if isinstance(target, torch.Tensor) and target.requires_grad and not inputs.requires_grad:
                found.detached_prediction = (name, tuple(inputs.shape))
        elif name in SWAPPABLE and found.swapped_arguments is None and torch.is_grad_enabled():
            target = argument(args, kwargs, 1, "target")
            if isinstance(target, torch.Tensor) and target.requires_grad and not inputs.requires_grad:
                found.swapped_arguments = (name, tuple(inputs.shape))
            elif name == "kl_div" and isinstance(target, torch.Tensor) and target.requires_grad \
                    and inputs.requires_grad and found.teacher_trained is None and target.dim() >= 2:
                found.teacher_trained = tuple(target.shape)
        if name in ("binary_cross_entropy", "binary_cross_entropy_with_logits") and found.one_label_parts is None \
                and inputs.requires_grad:
            target = argument(args, kwargs, 1, "target")
            labels = next((part for part in self._cat_parts if part[0] is target and part[2] is not None), None)
            scores = next((part for part in self._cat_parts if part[0] is inputs), None)
            if labels is not None and scores is not None and labels[1] == scores[1]:
                found.one_label_parts = (name, labels[1], labels[2])
        if name == "binary_cross_entropy_with_logits" and found.weight_not_pos_weight is None:
            found.weight_not_pos_weight = weight_not_pos_weight(argument(args, kwargs, 1, "target"),
                                                                argument(args, kwargs, 2, "weight"),
                                                                argument(args, kwargs, 6, "pos_weight"))
        if name in REGRESSION and found.two_scales is None and inputs.requires_grad:
            self._second_target(name, inputs, argument(args, kwargs, 1, "target"))
        if name in REGRESSION and found.uniform_noise_target is None:
            target = argument(args, kwargs, 1, "target")
            drawn = next((draw for draw, tensor in self._uniform_draws if tensor is target), None)
            if drawn is not None:
                found.uniform_noise_target = (name, drawn, tuple(target.shape))
        if name in (*REGRESSION, "binary_cross_entropy", "binary_cross_entropy_with_logits") \
                and found.vanishing_targets is None and found.off_map_targets is None:
            self._dense_targets(argument(args, kwargs, 1, "target"))

    def _weight_masks(self, first: Any, second: Any) -> None:
        """A product of a trained weight and a 0/1 mask, either way round (analyses/weight_masks.py)."""
        found = self.found
        for attribute, reading in (("mask_keeps_smallest", mask_keeps_smallest), ("mask_over_inputs", mask_over_inputs),
                                   ("mask_is_parameter", trained_mask)):
            if getattr(found, attribute) is None:
                setattr(found, attribute, reading(first, second) or reading(second, first))

    def _parts(self, args: tuple, kwargs: dict) -> None:
        """A cat along dim 0 of 1-D parts: scores of positives and negatives, or their labels."""
        tensors, dim = argument(args, kwargs, 0, "tensors"), argument(args, kwargs, 1, "dim", 0)
        if not isinstance(dim, int) or dim != 0 or not isinstance(tensors, (list, tuple)) or len(tensors) < 2 or len(self._cat_parts) >= 16 \
                or not all(isinstance(t, torch.Tensor) and t.dim() == 1 and t.numel() for t in tensors):
            return
        sizes = tuple(int(t.numel()) for t in tensors)
        label = None
        if not any(t.requires_grad for t in tensors):
            values = {float(v) for t in tensors for v in t.detach().unique().tolist()[:2]}
            label = values.pop() if len(values) == 1 else None
        self._pending_parts = (sizes, label)

    def _positive_first(self, args: tuple, kwargs: dict) -> None:
        """A MoCo-style cat([l_pos (B, 1), l_neg (B, K)], dim=1), K >= B: the positive in column 0."""
        tensors, dim = argument(args, kwargs, 0, "tensors"), argument(args, kwargs, 1, "dim", 0)
        if not isinstance(dim, int) or dim not in (1, -1) or not isinstance(tensors, (list, tuple)) or len(tensors) != 2 \
                or not all(isinstance(t, torch.Tensor) and t.dim() == 2 and t.requires_grad for t in tensors):
            return
        first, rest = tensors
        if first.shape[1] == 1 and first.shape[0] == rest.shape[0] >= ORDER_MIN_ROWS and rest.shape[1] >= rest.shape[0]:
            self._follow_positive_first = True

    def _second_target(self, name: str, prediction: torch.Tensor, target: Any) -> None:
        if not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.requires_grad \
                or target.shape != prediction.shape:
            return
        if self._regressed is None:
            self._regressed = (prediction.detach().clone(), target.detach().clone())
            return
        first_prediction, first_target = self._regressed
        if first_prediction.shape == prediction.shape and torch.equal(first_prediction, prediction.detach()):
            self.found.two_scales = two_scales(name, first_target, target)

    def _dense_targets(self, target: Any) -> None:
        """Dense target maps (B, ..., H, W) nearly all of which are tiny but not zero: values drawn
        in other units (a Gaussian heatmap with a sigma for normalised coordinates on a pixel grid)."""
        if not isinstance(target, torch.Tensor) or not target.is_floating_point() or target.dim() < 3 \
                or target[0].numel() < DENSE_MAP or target.requires_grad:
            return
        peaks = target.detach().flatten(1).abs().amax(1).float()
        tiny = (peaks > 0) & (peaks < TINY)
        share = float(tiny.float().mean())
        if share >= MOSTLY:
            self.found.vanishing_targets = (tuple(target.shape), share, float(peaks.max()))
            return
        self._off_map(target)

    def _off_map(self, target: torch.Tensor) -> None:
        """Heatmaps (…, H, W) in [0, 1] whose Gaussians are centred outside the map: a map's
        largest value then sits on its border and stays well below the 1 a centre inside gives
        (at most exp(-1/4) half a cell off with sigma 1). Keypoints in input pixels drawn on a
        strided map do this; invisible keypoints give all-zero maps, which are no evidence."""
        height, width = target.shape[-2:]
        if height < 4 or width < 4 or float(target.min()) < 0 or float(target.max()) > 1:
            return
        maps = target.detach().reshape(-1, height * width).float()
        peaks, where = maps.max(dim=1)
        rows, cols = where // width, where % width
        border = (rows == 0) | (rows == height - 1) | (cols == 0) | (cols == width - 1)
        faint = (peaks > 0) & (peaks < OFF_MAP_PEAK)
        drawn = peaks > 0
        if not bool(drawn.any()) or int(faint.sum()) < OFF_MAP_MIN_MAPS:
            return
        faint_share = float(faint.float().sum() / drawn.float().sum())
        on_border = float((faint & border).float().sum() / faint.float().sum())
        if faint_share >= OFF_MAP_SHARE and on_border >= OFF_MAP_BORDER:
            self.found.off_map_targets = (tuple(target.shape), faint_share, float((~drawn).float().mean()))


BOUNDED_OUTPUTS = ("SigmoidBackward0", "SoftmaxBackward0", "TanhBackward0", "ClampBackward1", "ClampMinBackward0",
                   "ReluBackward0", "ExpBackward0", "SoftplusBackward0", "AbsBackward0", "PowBackward0")


def cosine_over_broadcast(args: tuple, kwargs: dict) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """(x1 shape, x2 shape, dim) when cosine_similarity reduces an axis of size > 1 along which
    one input has size 1: the cosine of one input's value repeated against the other's values
    along the broadcast axis (z1[:, None] against z2[None] over the default dim=1, the batch),
    not of two vectors. None otherwise (pure)."""
    first, second = argument(args, kwargs, 0, "x1"), argument(args, kwargs, 1, "x2")
    dim = argument(args, kwargs, 2, "dim", 1)
    if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor) or not isinstance(dim, int):
        return None
    rank = max(first.dim(), second.dim())
    if not -rank <= dim < rank:
        return None
    shape1 = (1,) * (rank - first.dim()) + tuple(first.shape)
    shape2 = (1,) * (rank - second.dim()) + tuple(second.shape)
    axis = dim % rank
    sizes = sorted((shape1[axis], shape2[axis]))
    if sizes[0] != 1 or sizes[1] <= 1:
        return None
    return tuple(first.shape), tuple(second.shape), dim


def _raw_scores(tensor: Any) -> bool:
    """A float tensor that carries gradients and holds negative values, not the output of an
    activation that bounds it (what a soft overlap reads as probabilities must lie in [0, 1])."""
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and tensor.is_floating_point() \
        and tensor.dim() >= 1 and type(tensor.grad_fn).__name__ not in BOUNDED_OUTPUTS \
        and bool((tensor.detach() < 0).any())


def is_distribution(tensor: torch.Tensor) -> bool:
    """Rows of probabilities along the last dim (all in [0, 1], each summing to 1), not the
    log-probabilities kl_div reads its input as (those are all <= 0)."""
    if tensor.dim() < 1 or tensor.shape[-1] < 2 or not tensor.is_floating_point() or tensor.numel() == 0:
        return False
    values = tensor.detach().float()
    return bool((values >= 0).all()) and bool(((values.sum(-1) - 1).abs() < 1e-3).all()) and bool((values > 0).any())


def pitfall_findings(found: Pitfalls) -> list[Finding]:
    """The findings for what the watch recorded (``analyses.pitfall_findings``)."""
    from optimus_preflight.preflight.analyses.pitfall_findings import pitfall_findings as findings_of

    return findings_of(found)


MIN_OVERWRITTEN = 0.05  # of the target positions written by two sources or more


def scatter_overwrites(func: Any, args: tuple, kwargs: dict) -> tuple[str, tuple[int, ...], float] | None:
    """A scatter / index_copy of values that carry gradients (messages) whose index sends two or
    more of them to one position: all but one are dropped (pure). ``reduce=`` aggregates."""
    name = getattr(func, "__name__", "scatter")
    if kwargs.get("reduce") is not None or len(args) < 4:
        return None
    target, dim, index, source = args[0], args[1], args[2], args[3]
    if not (isinstance(target, torch.Tensor) and isinstance(index, torch.Tensor) and isinstance(dim, int)
            and isinstance(source, torch.Tensor) and source.requires_grad) or index.numel() < 2:
        return None
    with torch.no_grad():
        if name.startswith("index_copy"):
            if index.dim() != 1:
                return None
            written = int(index.unique().numel())
            return (name, tuple(index.shape), 1 - written / index.numel()) \
                if 1 - written / index.numel() >= MIN_OVERWRITTEN else None
        dim = dim % index.dim()
        # the first column along the scattered dim: a message index is one destination per row, expanded
        # over the features, and a graph's index may hold millions of rows
        column = index.movedim(dim, 0).reshape(index.shape[dim], -1)[:, 0]
        share = 1 - int(column.unique().numel()) / column.numel()
    return (name, tuple(index.shape), share) if share >= MIN_OVERWRITTEN else None


def softmax_spatial_axis(func: Any, args: tuple, kwargs: dict) -> tuple[str, tuple[int, ...], int] | None:
    """A softmax taken along one spatial axis of a (B, C, ...) map straight out of a convolution
    (through views), C >= 2: class scores normalised across positions, not across the classes (pure)."""
    from optimus_preflight.preflight.analyses.loss_spy import producing_op

    scores, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim")
    if not isinstance(scores, torch.Tensor) or not isinstance(dim, int) or scores.dim() < 4 or scores.shape[1] < 2 \
            or scores.grad_fn is None:
        return None
    dim = dim % scores.dim()
    if dim < 2 or scores.shape[dim] < 2 or producing_op(scores) != "ConvolutionBackward0":
        return None
    return getattr(func, "__name__", "softmax"), tuple(scores.shape), dim
