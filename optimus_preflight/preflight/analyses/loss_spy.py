"""See what the user's ``compute_loss`` feeds its criterion, without knowing its code.

A ``TorchFunctionMode`` observes every call to a torch function during the loss
computation. For the criteria (``cross_entropy``, ``nll_loss``, ``binary_cross_entropy``
and its logits variant, the regression losses; ``nn.*Loss`` modules call them) it
records summary statistics of the input and target *before* the call, so a criterion
that raises (a target out of range) is still described, the reduction, and the value
it returned; and it counts sigmoid/softmax calls. Only small statistics are kept,
never the tensors.

What the statistics reveal (pure functions in ``loss_findings``):
- softmax probabilities: non-negative rows summing to 1 along the class dimension;
- log-probabilities: all <= 0 with logsumexp ~ 0 along the class dimension;
- raw logits: anything else (positive values, rows not normalised);
- padding the criterion trains on (``padded_loss.py``): with ``reduction='none'`` the
  sums over all and over unpadded positions are kept, to tell which one the returned
  loss divides;
- the returned loss against the criterion's value: ``loss / accumulation_steps``;
- an input normalised over another dim than the class dim, and the target's shape as
  passed (``loss_shapes.py``: wrong-dim softmax, broadcasting elementwise losses);
- the target's profile (``target_profile.py``): ignored share, distinct classes,
  multi-hot rows of float targets;
- criterion arguments torch accepts silently (``criterion_args.py``): the CTC blank among
  the targets, a Poisson ``log_input`` on a non-negative output, ``scores[:, labels]``,
  per-sample weights times an already averaged loss;
- a spectral transform across the channels of ``(B, T, C)`` windows (``spectral_axis.py``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.api_pitfalls import PitfallWatch
from optimus_preflight.preflight.analyses.call_args import argument, touches_sparse
from optimus_preflight.preflight.analyses.channel_axis import ChannelAxisWatch
from optimus_preflight.preflight.analyses.class_weights import (
    FrequentClassWeights,
    WeightsOnBalancedBatch,
    pos_weight_down_weights_positives,
    weights_follow_counts,
    weights_on_balanced_batch,
)
from optimus_preflight.preflight.analyses.criterion_args import CriterionArgsWatch
from optimus_preflight.preflight.analyses.flatten_order import (
    FlattenMismatch,
    FlattenWatch,
    flatten_mismatch,
    flattened_from,
)
from optimus_preflight.preflight.analyses.graph_cuts import GraphCutWatch
from optimus_preflight.preflight.analyses.graph_propagation import PropagationWatch
from optimus_preflight.preflight.analyses.loss_shapes import (
    TOL,
    KlNormalisation,
    WrongNormalisation,
    kl_wrong_dims,
    log_sums_to_zero,
    sums_to_one,
    wrong_normalisation,
)
from optimus_preflight.preflight.analyses.output_range import (
    OutputRange,
    bounded_output,
    features_on_last_dim,
    output_activation,
    pooled_over_features,
)
from optimus_preflight.preflight.analyses.padding import (
    PaddingProfile,
    as_rows,
    edge_padding,
)
from optimus_preflight.preflight.analyses.pair_mask import PairMask, pair_mask
from optimus_preflight.preflight.analyses.per_sample_broadcast import SCALAR_ARITHMETIC as ARITHMETIC
from optimus_preflight.preflight.analyses.per_sample_broadcast import PerSampleWatch
from optimus_preflight.preflight.analyses.pseudo_labels import ArgmaxAgreement, argmax_agreement
from optimus_preflight.preflight.analyses.range_watch import RangeWatch
from optimus_preflight.preflight.analyses.spectral_axis import SpectralWatch
from optimus_preflight.preflight.analyses.target_profile import TargetProfile, profile_target
from optimus_preflight.preflight.analyses.view_permute import ViewWatch
from optimus_preflight.preflight.data_access.worker_stacks import user_frame_text

CLASS_CRITERIA = ("cross_entropy", "nll_loss")
BINARY_CRITERIA = ("binary_cross_entropy", "binary_cross_entropy_with_logits")
# Recorded for their reduction and value only (what the returned loss is compared with).
REGRESSION_CRITERIA = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "gaussian_nll_loss")
# Where each criterion takes ``reduction`` positionally (after input, target, ...).
_REDUCTION_INDEX = {"cross_entropy": 6, "nll_loss": 6, "binary_cross_entropy": 5,
                    "binary_cross_entropy_with_logits": 5, "mse_loss": 4, "l1_loss": 4, "smooth_l1_loss": 4,
                    "huber_loss": 2, "kl_div": 4, "gaussian_nll_loss": 5}
_LEGACY_INDEX = {"cross_entropy": (3, 5), "nll_loss": (3, 5), "binary_cross_entropy": (3, 4),
                 "binary_cross_entropy_with_logits": (3, 4), "mse_loss": (2, 3), "l1_loss": (2, 3),
                 "smooth_l1_loss": (2, 3), "kl_div": (2, 3)}
ACTIVATIONS = ("sigmoid", "softmax", "log_softmax")
# Criteria that compare their first two or three inputs sample by sample (anchor, positive, ...).
PAIRED_CRITERIA = ("triplet_margin_loss", "triplet_margin_with_distance_loss", "cosine_embedding_loss",
                   "margin_ranking_loss")
# Criteria whose target says +1 / -1, and the target's position.
SIGN_TARGETS = {"cosine_embedding_loss": 2, "margin_ranking_loss": 2, "hinge_embedding_loss": 1,
                "soft_margin_loss": 1}
SIGN_MODULES = {"cosine_embedding_loss": "CosineEmbeddingLoss", "margin_ranking_loss": "MarginRankingLoss",
                "hinge_embedding_loss": "HingeEmbeddingLoss", "soft_margin_loss": "SoftMarginLoss"}
# Elementwise arithmetic a hand-written loss is made of ((pred - y) ** 2, y * log(p)).
SIMILARITIES = ("cosine_similarity", "mse_loss", "smooth_l1_loss", "l1_loss")
SAMPLE_ROWS = 1024


@dataclass
class TensorStats:
    shape: tuple[int, ...]
    dtype: str
    is_floating: bool
    finite: bool
    min: float | None
    max: float | None
    # Along the class dimension (criteria over classes only).
    probability_rows: bool = False
    log_probability_rows: bool = False
    # Normalised over something other than the class dim (loss_shapes.wrong_normalisation).
    wrong_dims: list[WrongNormalisation] = field(default_factory=list)
    zero_fraction: float = 0.0  # of floating values exactly 0: logits cut at 0 by a ReLU
    whole: bool = False  # floating values that are all whole numbers
    distinct: int | None = None  # distinct values of a whole-number floating tensor
    mean: float | None = None  # of a finite floating tensor
    std: float | None = None


@dataclass
class ElementwiseSums:
    """Of a ``reduction='none'`` class criterion (padding found or not): the denominators
    a returned loss may have used, with their numerators."""

    total: float  # over every position
    positions: int
    targets: int  # positions not equal to ignore_index
    unpadded: float  # over the positions that are neither ignored nor padding
    unpadded_targets: int


@dataclass
class ColumnBroadcast:
    """Arithmetic between a learnable ``(n, 1)`` column and a constant ``(n,)`` vector (or
    the reverse), which broadcasts to ``(n, n)``: a prediction column against the batch's
    targets in a hand-written loss. Pairwise terms (``s[:, None] - s[None, :]``) combine
    two learnable or two constant operands and are not recorded."""

    op: str
    learnable_shape: tuple[int, ...]
    constant_shape: tuple[int, ...]
    joint_shape: tuple[int, ...] | None = None  # where it is not (B, B)
    kept_reduction: str | None = None  # the (B, 1) is a reduction kept as a column (keepdim=True)
    where: str | None = None  # the user's line that made the arithmetic
    flag: bool = False  # the constant is a 0/1 vector with both values: an event indicator or a row mask
    # the constant side is computed from inputs that require grad (a PINN's source term f(x) of the
    # collocation points), not read from the batch
    from_inputs: bool = False


@dataclass
class SlicedPair:
    """Inputs of a paired criterion that are column slices of the same rows of one tensor:
    ``emb.chunk(3, dim=-1)`` where the rows of a stacked ``(3B, D)`` forward were meant
    (``chunk(3, dim=0)``). Each 'anchor' is then compared with other features of itself."""

    function: str
    shape: tuple[int, ...]  # of each slice
    row_length: int  # of the tensor they were cut from


def feature_slices_of_same_rows(inputs: list[torch.Tensor]) -> int | None:
    """The row length of the tensor that two or more ``inputs`` slice along its last dim;
    slices of different rows (``chunk(dim=0)``) start a multiple of a row apart."""
    views = [t for t in inputs if t.dim() == 2 and t.shape[0] > 1 and t.stride(-1) == 1]
    for i, first in enumerate(views):
        for second in views[i + 1:]:
            if (first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
                    or first.stride() != second.stride() or first.shape != second.shape):
                continue
            row = first.stride(0)
            gap = abs(second.storage_offset() - first.storage_offset())
            if row >= first.shape[1] * 2 and gap % row and gap < row:
                return row
    return None


REDUCTIONS = {"NormBackward1": "a norm or F.pairwise_distance", "LinalgVectorNormBackward0": "a norm",
              "SumBackward1": "a sum", "MeanBackward1": "a mean", "AmaxBackward0": "a max",
              "LogsumexpBackward0": "a logsumexp"}
ELEMENTWISE = {"PowBackward0", "MulBackward1", "DivBackward1", "RsubBackward1", "AddBackward1", "SubBackward1",
               "NegBackward0", "ReluBackward0", "ClampMinBackward0", "ClampBackward1", "SqrtBackward0",
               "ExpBackward0", "SigmoidBackward0", "AbsBackward0"}


def kept_reduction(column: torch.Tensor) -> str | None:
    """The reduction a learnable (B, 1) column was taken with keepdim=True, found back through
    the elementwise ops after it (d ** 2, relu(margin - d)); None when it is another output."""
    node = column.grad_fn
    for _ in range(6):
        if node is None:
            return None
        name = type(node).__name__
        if name in REDUCTIONS:
            return REDUCTIONS[name]
        if name not in ELEMENTWISE or not node.next_functions:
            return None
        node = node.next_functions[0][0]
    return None


def row_blocks_of_one_tensor(inputs: list[torch.Tensor]) -> tuple[int, int] | None:
    """(blocks, rows per block) when two or three inputs are consecutive row blocks of one
    tensor, in order: ``emb.chunk(k, dim=0)`` of a (k * n, D) forward."""
    if len(inputs) < 2 or any(t.dim() < 2 or t.layout != torch.strided for t in inputs):
        return None
    first = inputs[0]
    rows, step = first.shape[0], first.stride(0)
    if rows < 2 or any(t.shape != first.shape or t.stride() != first.stride()
                       or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr() for t in inputs):
        return None
    offsets = [t.storage_offset() - first.storage_offset() for t in inputs]
    return (len(inputs), rows) if offsets == [i * rows * step for i in range(len(inputs))] else None


GRAPH_NODES = 4096  # nodes walked back from a tensor before giving up on finding a parameter


def plausible_pair(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Shapes column_broadcast would record: a column against a vector, or per-row tensors of
    different ranks (checked before the graph walk that tells the two sides apart)."""
    if first.dim() == 0 or second.dim() == 0 or first.shape[0] != second.shape[0] or first.shape[0] < 2:
        return False
    return first.dim() != second.dim()


def reaches_parameter(tensor: torch.Tensor) -> bool:
    """Whether the autograd graph behind ``tensor`` reaches an ``nn.Parameter`` (within
    GRAPH_NODES nodes)."""
    if isinstance(tensor, torch.nn.Parameter):
        return True
    seen, stack = set(), [tensor.grad_fn]
    while stack and len(seen) < GRAPH_NODES:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(getattr(node, "variable", None), torch.nn.Parameter):
            return True
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return False


def column_broadcast(name: str, args: tuple) -> ColumnBroadcast | None:
    if name not in ARITHMETIC or len(args) < 2:
        return None
    first, second = args[0], args[1]
    if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)):
        return None
    if first.requires_grad == second.requires_grad:
        # Both in the graph: a PINN's forcing f(x) is computed from coordinates that require grad
        # for the derivatives, but only the model's side reaches a parameter.
        if not first.requires_grad or not plausible_pair(first, second):
            return None
        first_learns, second_learns = reaches_parameter(first), reaches_parameter(second)
        if first_learns == second_learns:
            return None
        learnable, constant = (first, second) if first_learns else (second, first)
    else:
        learnable, constant = (first, second) if first.requires_grad else (second, first)
    shapes = {tuple(learnable.shape), tuple(constant.shape)}
    rows = learnable.shape[0] if learnable.dim() else 0
    if rows >= 2 and shapes == {(rows, 1), (rows,)}:
        reduced = kept_reduction(learnable) if tuple(learnable.shape) == (rows, 1) else None
        flag = (name.strip("_") in ("mul", "rmul") and not constant.is_complex()
                and bool(((constant == 0) | (constant == 1)).all()) and bool((constant == 0).any())
                and bool((constant == 1).any()))
        return ColumnBroadcast(name.strip("_"), tuple(learnable.shape), tuple(constant.shape), kept_reduction=reduced,
                               flag=flag, from_inputs=constant.requires_grad)
    # Any per-sample prediction against per-sample targets whose batch axes land on different
    # dims: (N, 4) - (N, 1, 4) is (N, N, 4), every prediction against every target.
    if rows >= 2 and constant.dim() >= 1 and constant.shape[0] == rows and learnable.dim() != constant.dim():
        try:
            joint = torch.broadcast_shapes(learnable.shape, constant.shape)
        except RuntimeError:
            return None
        if math.prod(joint) == rows * max(learnable.numel(), constant.numel()):
            return ColumnBroadcast(name.strip("_"), tuple(learnable.shape), tuple(constant.shape), tuple(joint),
                                   from_inputs=constant.requires_grad)
    return None


@dataclass
class CriterionCall:
    function: str
    input: TensorStats
    target: TensorStats | None
    n_classes: int | None
    ignore_index: int | None
    loss: float | None = None  # the mean of the criterion's output, when it returned
    error: str | None = None
    reduction: str = "mean"
    target_numel: int | None = None  # before ignored positions are dropped
    padding: PaddingProfile | None = None  # padding it trains on (not ignored)
    sums: ElementwiseSums | None = None
    target_shape: tuple[int, ...] | None = None  # as passed, before ignored positions are dropped
    profile: TargetProfile | None = None  # classes, ignored share, multi-hot rows
    # binary_cross_entropy only: (rows whose probabilities sum to 1 over the last dim, i.e. a
    # softmax made the labels compete; the most positive labels any target row holds)
    competing: tuple[bool, float] | None = None
    kl_normalisation: KlNormalisation | None = None  # kl_div only: its input normalised over the wrong dim
    output_range: OutputRange | None = None  # regression: a bounded output activation vs the targets
    target_base: torch.Tensor | None = None  # the tensor a flattened class target is a view of
    frequent_class_weights: FrequentClassWeights | None = None  # weight / pos_weight favouring frequent classes
    balanced_twice: WeightsOnBalancedBatch | None = None  # unequal class weights on a batch already balanced
    logit_activation: str | None = None  # class criteria: the op behind the logits (Sigmoid: bounded logits)
    target_tensor: torch.Tensor | None = None  # regression criteria: the target as passed (held for the step only)
    target_is_drawn_noise: bool = False  # a standard-normal target drawn in the loss (a diffusion model's noise)
    always_on_label: tuple[int, float, float] | None = None  # multi-hot: (column, its positive rate, median rate)
    # (B, K-1) cumulative 0/1 level targets (each row 1...1 0...0): (rows, levels, first level always 1)
    cumulative_levels: tuple[int, int, bool] | None = None
    classes_last: bool = False  # a (B, T, C) input straight from a linear layer: classes on the last dim, not dim 1
    pooled_features: str | None = None  # the reduction over a (B, T, C) linear output's last dim that made the input
    input_op: str | None = None  # the autograd op that made the input, through views (SumBackward0: a .sum() with no dim)
    similarity_product: bool = False  # square (B, B) scores of a @ b.T: in-batch similarities, positives on the diagonal
    class_target: torch.Tensor | None = None  # (B,) class ids of a class criterion (held for the step only)
    where: str | None = None  # the user's line that called the criterion
    argmax_agreement: ArgmaxAgreement | None = None  # (B, C) logits: how often the target is their argmax
    target_storage: int | None = None  # the data pointer of the target's storage as passed (a batch tensor's?)

    @property
    def hard_targets(self) -> bool:
        return self.target is not None and not self.target.is_floating


VIEW_OPS = ("ViewBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "ExpandBackward0",
            "AliasBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "CloneBackward0", "ToCopyBackward0")


def producing_op(tensor: torch.Tensor) -> str | None:
    """The name of the autograd op behind ``tensor``, looking through views and copies."""
    node = tensor.grad_fn
    for _ in range(8):
        if node is None or type(node).__name__ not in VIEW_OPS:
            break
        parents = [next_node for next_node, _ in node.next_functions if next_node is not None]
        node = parents[0] if parents else None
    return type(node).__name__ if node is not None else None


PRODUCT_OPS = ("MmBackward0", "BmmBackward0", "MatmulBackward0")
SCALING_OPS = ("MulBackward0", "DivBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0")


def is_similarity_product(tensor: torch.Tensor) -> bool:
    """Whether square ``(B, B)`` scores are a product of two ``(B, D)`` embeddings of the
    batch (``a @ b.T``, scaled by a temperature or transposed): row i and column i then come
    from the same sample, and the positives of an in-batch loss sit on the diagonal."""
    if tensor.dim() != 2 or tensor.shape[0] != tensor.shape[1]:
        return False
    node = tensor.grad_fn
    for _ in range(8):
        name = type(node).__name__ if node is not None else None
        if name in PRODUCT_OPS:
            return True
        if name not in VIEW_OPS + SCALING_OPS:
            return False
        parents = [next_node for next_node, _ in node.next_functions if next_node is not None]
        # a temperature is a leaf (AccumulateGrad) or no node at all: follow the computed operand
        computed = [p for p in parents if type(p).__name__ != "AccumulateGrad"]
        node = computed[0] if computed else None
    return False


def _stats(tensor: torch.Tensor, class_dim: int | None, shapes: list[tuple[int, int]] | None = None) -> TensorStats:
    """Statistics of the first ``SAMPLE_ROWS`` rows: an LM's logits can be gigabytes,
    and a float copy of all of them could itself run a GPU out of memory. Integer
    tensors (class targets) are small and are scanned whole, so no bad label hides."""
    with torch.no_grad():
        values = tensor.detach()
        is_floating = values.is_floating_point()
        if is_floating and values.dim() > 0:
            values = values[:SAMPLE_ROWS].float()
        elif not is_floating:
            values = values.long()
        finite = bool(torch.isfinite(values).all()) if is_floating else True
        empty = values.numel() == 0
        stats = TensorStats(
            shape=tuple(tensor.shape),
            dtype=str(tensor.dtype).replace("torch.", ""),
            is_floating=is_floating,
            finite=finite,
            min=None if empty else float(values.min()),
            max=None if empty else float(values.max()),
        )
        if is_floating and not empty:
            stats.zero_fraction = float((values == 0).float().mean())
            if finite:
                stats.mean = float(values.mean())
                stats.std = float(values.std()) if values.numel() > 1 else 0.0
                stats.whole = bool((values == values.round()).all())
                stats.distinct = int(values.unique().numel()) if stats.whole else None
        if class_dim is not None and is_floating and finite and not empty and values.shape[class_dim] > 1:
            if stats.min >= 0:
                stats.probability_rows = sums_to_one(values, class_dim)
            if stats.max <= TOL:
                stats.log_probability_rows = log_sums_to_zero(values, class_dim)
            if not (stats.probability_rows or stats.log_probability_rows):
                stats.wrong_dims = wrong_normalisation(values, tuple(tensor.shape), class_dim, shapes or [],
                                                       stats.min, stats.max)
    return stats


def _reduction(name: str, args: tuple, kwargs: dict) -> str:
    if name in _LEGACY_INDEX:  # the deprecated size_average/reduce pair, where a caller still passes it
        size_average_at, reduce_at = _LEGACY_INDEX[name]
        if argument(args, kwargs, reduce_at, "reduce") is False:
            return "none"
        if argument(args, kwargs, size_average_at, "size_average") is False:
            return "sum"
    return str(argument(args, kwargs, _REDUCTION_INDEX[name], "reduction", "mean"))


class LossSpy(TorchFunctionMode):
    """Use as a context manager around ``compute_loss``. ``shapes``: the (rows, length)
    a flattened class target may be viewed as (``padding.sequence_shapes`` of the batch),
    for the padding analysis; without them only 2-D targets are analysed."""

    def __init__(self, shapes: list[tuple[int, int]] | None = None,
                 parameter_names: dict[int, str] | None = None) -> None:
        super().__init__()
        self.graph_cuts = GraphCutWatch(parameter_names or {})  # .detach(), .numpy() on tensors with a graph
        self.propagation = PropagationWatch()  # message passing over an adjacency without self-loops
        self.calls: list[CriterionCall] = []
        # The criteria's 0-dim outputs, held for the step only (the probe drops them): what the
        # returned loss's gradient is measured against.
        self.scalar_outputs: list[torch.Tensor] = []
        self.scalar_sources: list[tuple[str, Any]] = []  # (criterion, target) of each scalar output
        self.activations: dict[str, int] = {name: 0 for name in ACTIVATIONS}
        # shapes given softmax / log_softmax: a hand-written class loss over (B, C) logits
        self.normalised_shapes: set[tuple[int, ...]] = set()
        self.shapes = shapes or []
        self.column_broadcasts: list[ColumnBroadcast] = []
        # The rows of the batch compute_loss gets: only a column that long is a per-sample
        # prediction (a learnable (d, 1) weight column is the model's business).
        self.batch_rows: int | None = None
        # F.normalize over dim 0 of a (batch, features) tensor: each feature scaled across
        # the batch, not each sample's vector to unit length. (shape, dim) of the first one.
        self.batch_normalize: tuple[tuple[int, ...], int] | None = None
        # softmax / log_softmax over dim 0 of a per-sample output: (function, shape) of the first one
        self.batch_softmax: tuple[str, tuple[int, ...]] | None = None
        self.sliced_pair: SlicedPair | None = None
        self.zero_one_sign_target: str | None = None  # a +1/-1 criterion given 0/1 targets: its name
        self.attention_queries: list[tuple[int, ...]] = []  # shapes of scaled_dot_product_attention's queries
        self.channel_axis = ChannelAxisWatch()  # a conv map reduced over its channels and one spatial axis
        self.views = ViewWatch()  # a view/reshape to the input's sizes in another order
        self.flatten_mismatch: FlattenMismatch | None = None  # (T, B) logits rows against (B, T) target rows
        self.flattened = FlattenWatch()  # the shape each reshape/view/flatten output came from
        self.criterion_args = CriterionArgsWatch()  # CTC blank in targets, Poisson log_input, scores[:, labels]
        self.spectral = SpectralWatch()  # an FFT across the channels of (B, T, C) windows
        self.pitfalls = PitfallWatch()  # a 1-D .T, torch.meshgrid without indexing=
        self.per_sample = PerSampleWatch()  # a (B,) coefficient meeting (B, D = B) features
        # cosine_similarity / a regression criterion between two tensors that both carry gradients: a
        # self-supervised similarity with no stop-gradient (step.collapse follows it)
        self.symmetric_similarity: str | None = None
        self.normalized = False  # F.normalize ran in the step (cosine logits: ArcFace, CosFace, NormFace)
        self.pair_mask: PairMask | None = None  # labels[:, None] == labels[None, :]: in-batch positives
        self.ranges = RangeWatch()  # a layer fed the batch's data and a tanh / sigmoid output out of its range
        # (criterion, blocks, rows) where a paired criterion's inputs are consecutive row blocks of one
        # tensor (emb.chunk(3) of a stacked forward): the probe asks how the model's input was stacked
        self.row_blocks: tuple[str, int, int] | None = None
        # (B,) tensors without grad tiled with .repeat(k): (tensor, k), held for the step
        self._tiled: list[tuple[torch.Tensor, int]] = []
        # (op, rows, k) where a tiled (B,) target meets a model output flattened from (B, k) sample by sample
        self.tiled_against_rows: tuple[str, int, int] | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if touches_sparse(args, kwargs):
            # The watches read dense values; only the propagation watch reads a sparse adjacency.
            self.propagation.before(getattr(func, "__name__", ""), args)
            out = func(*args, **kwargs)
            self.propagation.after(out)
            return out
        name = getattr(func, "__name__", "")
        self.pitfalls.observe(func, args, kwargs)
        cut = self.graph_cuts.before(name, func, args)
        self.propagation.before(name, args)
        if self.pair_mask is None and name in ("eq", "__eq__"):
            self.pair_mask = pair_mask(name, args)
        self.per_sample.rows = self.batch_rows or 0
        self.per_sample.before(name, args)
        if self.symmetric_similarity is None and name in SIMILARITIES and len(args) >= 2 \
                and all(isinstance(a, torch.Tensor) and a.requires_grad and a.dim() >= 2 for a in args[:2]) \
                and args[0].shape == args[1].shape:
            self.symmetric_similarity = name
        record = pad_mask = None
        if name in CLASS_CRITERIA + BINARY_CRITERIA + REGRESSION_CRITERIA:
            record, pad_mask = self._describe(name, args, kwargs)
            record.where = user_frame_text(sys._getframe(1), through_package=False)
            self.calls.append(record)
            if self.flatten_mismatch is None:
                self.flatten_mismatch = flatten_mismatch(name, argument(args, kwargs, 0, "input"),
                                                         argument(args, kwargs, 1, "target"), self.flattened)
        elif name in ACTIVATIONS:
            self.activations[name] += 1
            if name != "sigmoid" and args and isinstance(args[0], torch.Tensor) and len(self.normalised_shapes) < 16:
                self.normalised_shapes.add(tuple(args[0].shape))
        if name == "scaled_dot_product_attention" and args and isinstance(args[0], torch.Tensor) \
                and len(self.attention_queries) < 4:
            self.attention_queries.append(tuple(args[0].shape))
        if name in SIGN_TARGETS and self.zero_one_sign_target is None:
            target = argument(args, kwargs, SIGN_TARGETS[name], "target")
            if isinstance(target, torch.Tensor) and target.numel() and bool(((target == 0) | (target == 1)).all()) \
                    and bool((target == 0).any()):
                self.zero_one_sign_target = name
        if name in PAIRED_CRITERIA and self.sliced_pair is None:
            inputs = [a for a in args[:3] if isinstance(a, torch.Tensor)]
            row = feature_slices_of_same_rows(inputs)
            if row is not None:
                self.sliced_pair = SlicedPair(name, tuple(inputs[0].shape), row)
            if self.row_blocks is None and (blocks := row_blocks_of_one_tensor(inputs)) is not None:
                self.row_blocks = (name, *blocks)
        elif name == "normalize":
            self.normalized = True
            if self.batch_normalize is None:
                self._check_normalize(args, kwargs)
        elif name in ("softmax", "log_softmax", "logsumexp") and self.batch_softmax is None:
            self._check_softmax(name, args, kwargs)
        if self._tiled and self.tiled_against_rows is None and (name in ARITHMETIC or name in REGRESSION_CRITERIA):
            self._tiled_target(name, args)
        if name in ARITHMETIC and not self.column_broadcasts:
            found = column_broadcast(name, args)
            if found is not None and found.learnable_shape[0] == self.batch_rows:
                found.where = user_frame_text(sys._getframe(1), through_package=False)
                self.column_broadcasts.append(found)
        self.criterion_args.before(name, args, kwargs)
        self.spectral.observe(name, args, kwargs)
        self.ranges.before(name, args)
        try:
            out = func(*args, **kwargs)
        except Exception as error:
            if record is not None:
                record.error = f"{type(error).__name__}: {error}"
            raise
        if touches_sparse((), {}, out):  # made sparse here (to_sparse): nothing the watches can read
            return out
        self.graph_cuts.after(cut, out)
        if record is not None:
            self.graph_cuts.criterion(name, out, argument(args, kwargs, 1, "target"))
        self.pitfalls.after(name, out)
        self.ranges.after(name, out)
        self.propagation.after(out)
        self.per_sample.after(out)
        self.channel_axis.observe(name, args, kwargs, out)
        self.views.observe(name, args, out)
        self.flattened.observe(name, args, out)
        if name == "repeat" and len(args) == 2 and isinstance(args[0], torch.Tensor) and isinstance(args[1], int) \
                and args[1] >= 2 and args[0].dim() == 1 and not args[0].requires_grad and self.batch_rows \
                and len(args[0]) == self.batch_rows and len(self._tiled) < 8 and isinstance(out, torch.Tensor):
            self._tiled.append((out, args[1]))
        self.criterion_args.after(name, args, out, kwargs)
        if record is not None and isinstance(out, torch.Tensor) and out.dim() == 0 and out.requires_grad:
            self.scalar_outputs.append(out)
            self.scalar_sources.append((name, argument(args, kwargs, 1, "target")))
        if record is not None and isinstance(out, torch.Tensor) and out.numel():
            record.loss = float(out.detach().float().mean())
            if pad_mask is not None and record.reduction == "none" and out.numel() == pad_mask.numel():
                record.sums = _elementwise_sums(out, argument(args, kwargs, 1, "target"), pad_mask, record.ignore_index)
        return out

    def _tiled_target(self, name: str, args: tuple) -> None:
        """y.repeat(k) of the batch's (B,) targets meeting a model output flattened from (B, k): the
        output's rows run sample by sample (i * k .. i * k + k - 1), the tiled targets batch by batch."""
        tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if len(tensors) != 2:
            return
        for tiled, other in (tensors, tensors[::-1]):
            views = next((k for made, k in self._tiled if made is tiled), None)
            if views is None or not other.requires_grad or other.shape != tiled.shape:
                continue
            source = flattened_from(other, self.flattened)
            if source is not None and len(source) == 2 and source == (self.batch_rows, views):
                self.tiled_against_rows = (name.strip("_"), int(source[0]), views)
                return

    def _check_softmax(self, name: str, args: tuple, kwargs: dict) -> None:
        """A softmax across the samples of a model output: dim 0 of (B, C, ...) maps or sequences,
        or of (B, C) scores over three classes or more that are not a (B, B) similarity table (a
        (N, 1) attention over a bag's instances is one column)."""
        tensor, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "dim", None)
        if not (isinstance(tensor, torch.Tensor) and isinstance(dim, int) and tensor.requires_grad
                and tensor.dim() >= 2 and dim in (0, -tensor.dim()) and self.batch_rows
                and tensor.shape[0] == self.batch_rows):
            return
        if tensor.dim() >= 3 or (tensor.shape[1] >= 3 and tensor.shape[1] != tensor.shape[0]):
            self.batch_softmax = (name, tuple(tensor.shape))

    def _check_normalize(self, args: tuple, kwargs: dict) -> None:
        tensor, dim = argument(args, kwargs, 0, "input"), argument(args, kwargs, 2, "dim", 1)
        if (isinstance(tensor, torch.Tensor) and isinstance(dim, int) and tensor.dim() == 2 and tensor.requires_grad
                and dim in (0, -2) and self.batch_rows and tensor.shape[0] % self.batch_rows == 0
                and tensor.shape[1] != tensor.shape[0]):  # (B, D), or (2B, D) of two views stacked
            self.batch_normalize = (tuple(tensor.shape), dim)

    def _describe(self, name: str, args: tuple, kwargs: dict) -> tuple[CriterionCall, torch.Tensor | None]:
        inputs = argument(args, kwargs, 0, "input")
        target = argument(args, kwargs, 1, "target")
        class_dim = None
        if name in CLASS_CRITERIA and isinstance(inputs, torch.Tensor):
            class_dim = 1 if inputs.dim() >= 2 else 0
        n_classes = int(inputs.shape[class_dim]) if class_dim is not None else None
        ignore_index = argument(args, kwargs, 4, "ignore_index", -100) if name in CLASS_CRITERIA else None
        record = CriterionCall(
            function=name,
            input=None,
            target=None,
            n_classes=n_classes,
            ignore_index=ignore_index,
            reduction=_reduction(name, args, kwargs),
            target_numel=target.numel() if isinstance(target, torch.Tensor) else None,
            target_shape=tuple(target.shape) if isinstance(target, torch.Tensor) else None,
        )
        if (name in CLASS_CRITERIA and isinstance(target, torch.Tensor) and target.dim() == 1
                and isinstance(target._base, torch.Tensor) and target._base.numel() == target.numel()):
            record.target_base = target._base
        if isinstance(target, torch.Tensor) and name in CLASS_CRITERIA + BINARY_CRITERIA:
            record.profile = profile_target(name, target, ignore_index, self.shapes, class_dim)
        if name in CLASS_CRITERIA and isinstance(target, torch.Tensor) and isinstance(inputs, torch.Tensor) \
                and not target.is_sparse:
            record.argmax_agreement = argmax_agreement(inputs, target, ignore_index)
            record.target_storage = target.untyped_storage().data_ptr()
        pad_mask = None
        if name in CLASS_CRITERIA and isinstance(target, torch.Tensor) and not target.is_floating_point():
            rows = as_rows(target, self.shapes)
            if rows is not None:
                record.padding, pad_mask = edge_padding(rows, ignore_index)
                weight = argument(args, kwargs, 2, "weight")
                if (record.padding is not None and isinstance(weight, torch.Tensor)
                        and 0 <= record.padding.value < weight.numel() and float(weight[record.padding.value]) == 0):
                    record.padding = pad_mask = None  # a zero class weight masks the pad id
            if pad_mask is None and record.reduction == "none":
                pad_mask = torch.zeros(target.shape, dtype=torch.bool, device=target.device)  # ignored positions only
        if isinstance(target, torch.Tensor) and ignore_index is not None and not target.is_floating_point():
            target = target[target != ignore_index]  # ignored positions may hold any sentinel
        record.input = _stats(inputs, class_dim, self.shapes) if isinstance(inputs, torch.Tensor) else None
        record.input_op = producing_op(inputs) if isinstance(inputs, torch.Tensor) else None
        record.similarity_product = isinstance(inputs, torch.Tensor) and is_similarity_product(inputs)
        record.target = _stats(target, None) if isinstance(target, torch.Tensor) else None
        if name in BINARY_CRITERIA and isinstance(target, torch.Tensor):
            record.always_on_label = always_on_label(target)
            record.cumulative_levels = cumulative_levels(target)
        if name in REGRESSION_CRITERIA and isinstance(target, torch.Tensor) and not target.requires_grad:
            record.target_tensor = target
        if name in CLASS_CRITERIA and isinstance(target, torch.Tensor) and target.dim() == 1 \
                and not target.is_floating_point():
            record.class_target = target.detach()
        if name in CLASS_CRITERIA and isinstance(inputs, torch.Tensor) and inputs.requires_grad:
            record.logit_activation = output_activation(inputs)
            record.classes_last = inputs.dim() >= 3 and features_on_last_dim(inputs)
        if (name in CLASS_CRITERIA or name in BINARY_CRITERIA) and isinstance(inputs, torch.Tensor) \
                and inputs.requires_grad:
            record.pooled_features = pooled_over_features(inputs)
        weight = argument(args, kwargs, 2, "weight")
        if name in CLASS_CRITERIA and isinstance(weight, torch.Tensor) and isinstance(target, torch.Tensor) \
                and not target.is_floating_point():
            record.frequent_class_weights = weights_follow_counts(weight, target, ignore_index)
            record.balanced_twice = weights_on_balanced_batch(name, weight, target, ignore_index)
        pos_weight = argument(args, kwargs, 6, "pos_weight") if name == "binary_cross_entropy_with_logits" else None
        if isinstance(pos_weight, torch.Tensor) and isinstance(target, torch.Tensor):
            record.frequent_class_weights = pos_weight_down_weights_positives(pos_weight, target)
            record.balanced_twice = weights_on_balanced_batch(name, pos_weight, target, None)
        if name == "binary_cross_entropy" and isinstance(inputs, torch.Tensor) and isinstance(target, torch.Tensor):
            record.competing = _competing_labels(inputs, target)
        if (name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss") and isinstance(inputs, torch.Tensor)
                and isinstance(target, torch.Tensor)):
            record.output_range = bounded_output(inputs, target)
        if name == "kl_div" and isinstance(inputs, torch.Tensor) and isinstance(target, torch.Tensor):
            log_target = bool(argument(args, kwargs, 5, "log_target", False))
            record.kl_normalisation = kl_wrong_dims(inputs, target, log_target, SAMPLE_ROWS)
        return record, pad_mask


ALWAYS_ON = 0.8  # a label column positive in this share of the rows ...
SPARSE_MEDIAN = 0.3  # ... while the median column is below this: not a label, something set on every row
MIN_LABEL_ROWS = 16


def always_on_label(target: torch.Tensor) -> tuple[int, float, float] | None:
    """For (B, L) 0/1 multi-hot targets: a column set in nearly every row among sparse ones,
    e.g. the padding id of variable-length tag lists scattered into the multi-hot rows."""
    if target.dim() != 2 or target.shape[0] < MIN_LABEL_ROWS or target.shape[1] < 3:
        return None
    with torch.no_grad():
        values = target.detach().float()
        if not bool(((values == 0) | (values == 1)).all()):
            return None
        rates = values.mean(dim=0)
        column = int(rates.argmax())
        median = float(rates.median())
        if float(rates[column]) >= ALWAYS_ON and median <= SPARSE_MEDIAN:
            return column, float(rates[column]), median
    return None


def cumulative_levels(target: torch.Tensor) -> tuple[int, int, bool] | None:
    """For (B, L) 0/1 targets whose every row is a run of ones then zeros (an ordinal grade
    encoded as levels ``y > k``, CORAL / cumulative link): the rows, the levels, and whether
    the first level is 1 in every row (levels built as ``y >= k`` from k = 0 are always true
    at k = 0, and every decoded grade comes out one too high)."""
    if target.dim() != 2 or target.shape[0] < MIN_LABEL_ROWS or target.shape[1] < 2:
        return None
    with torch.no_grad():
        values = target.detach().float()
        if not bool(((values == 0) | (values == 1)).all()) or not bool((values[:, 1:] <= values[:, :-1]).all()):
            return None
        grades = values.sum(dim=1)
        if int(grades.unique().numel()) < 3:  # one or two patterns: a binary task, not levels
            return None
        return values.shape[0], values.shape[1], bool((values[:, 0] == 1).all())


def _competing_labels(inputs: torch.Tensor, target: torch.Tensor) -> tuple[bool, float] | None:
    """Per-label probabilities of a (B, L) BCE input that sum to 1 along the labels."""
    if inputs.dim() < 2 or inputs.shape[-1] < 2 or inputs.shape != target.shape:
        return None
    with torch.no_grad():
        values = inputs.detach()[:SAMPLE_ROWS].float()
        if not bool(torch.isfinite(values).all()) or float(values.min()) < 0:
            return None
        return sums_to_one(values, -1), float(target.detach()[:SAMPLE_ROWS].float().sum(dim=-1).max())


def _elementwise_sums(out: torch.Tensor, target: torch.Tensor, pad_mask: torch.Tensor, ignore_index: int | None) -> ElementwiseSums:
    with torch.no_grad():
        values = out.detach().float().reshape(pad_mask.shape)
        valid = (target != ignore_index).reshape(pad_mask.shape) if ignore_index is not None else torch.ones_like(pad_mask)
        unpadded = valid & ~pad_mask
        return ElementwiseSums(float(values.sum()), values.numel(), int(valid.sum()), float(values[unpadded].sum()),
                               int(unpadded.sum()))
