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

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_findings import Finding


TRANSPOSE = torch._C.TensorBase.__dict__.get("T")  # the .T property's descriptor: its __get__ reaches the mode


MASKED_FILLS = (torch.masked_fill, torch.Tensor.masked_fill, torch.Tensor.masked_fill_)
SOFTMAXES = (torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax)
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


class PitfallWatch:
    """Fed every torch function call the loss spy sees (``LossSpy.__torch_function__``)."""

    def __init__(self) -> None:
        self.found = Pitfalls()
        # The autograd nodes of tensors given masked_fill with a value that is no -inf (held, so
        # their ids stay theirs while the step runs).
        self._filled_mildly: list[Any] = []
        self._uniform_draws: list[tuple[str, torch.Tensor]] = []  # held for the step only
        self._masked_scores: list[torch.Tensor] = []  # raw scores multiplied with a 0/1 mask, held for the step

    def after(self, name: str, out: Any) -> None:
        """Keep the tensors drawn uniform on [0, 1) in the step (torch.rand, rand_like)."""
        if name in UNIFORM_DRAWS and isinstance(out, torch.Tensor) and out.is_floating_point() \
                and out.numel() >= UNIFORM_MIN and len(self._uniform_draws) < 8:
            self._uniform_draws.append((name, out))

    def release(self) -> None:
        self._uniform_draws.clear()
        self._masked_scores.clear()

    def observe(self, func: Any, args: tuple, kwargs: dict) -> None:
        if self.found.inverted_corners is None and getattr(func, "__name__", "") in ("sub", "__sub__"):
            self.found.inverted_corners = inverted_corners(func.__name__, args)
        if self.found.overlap_on_raw_scores is None:
            self._overlap_terms(getattr(func, "__name__", ""), args)
        if getattr(func, "__self__", None) is TRANSPOSE:
            tensor = args[0] if args else None
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 1 and len(self.found.transposed_1d) < 4:
                self.found.transposed_1d.append(tuple(tensor.shape))
        elif func is torch.meshgrid and kwargs.get("indexing") is None and len(self.found.meshgrid_default) < 4:
            tensors = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            self.found.meshgrid_default.append(tuple(t.numel() for t in tensors if isinstance(t, torch.Tensor)))
        elif func in (torch.gather, torch.Tensor.gather):
            self._gather(args, kwargs)
        elif func in (torch.sum, torch.Tensor.sum) and self.found.weighted_sum_off_axis is None:
            self._weighted_sum(args, kwargs)
            self._embedding_pooled("sum", args, kwargs)
        elif func in (torch.mean, torch.Tensor.mean, torch.amax, torch.Tensor.amax):
            self._embedding_pooled(getattr(func, "__name__", "mean"), args, kwargs)
        elif func in MATMULS and self.found.softmax_off_axis is None:
            self._matmul(args)
        elif func in MASKED_FILLS:
            self._masked_fill(args, kwargs)
        elif func in SOFTMAXES and self.found.masked_with_zero is None:
            self._masked_softmax(args, kwargs)
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

    def _criterion(self, name: str, args: tuple, kwargs: dict) -> None:
        found = self.found
        inputs = argument(args, kwargs, 0, "input")
        if not isinstance(inputs, torch.Tensor):
            return
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
        if name in REGRESSION and found.uniform_noise_target is None:
            target = argument(args, kwargs, 1, "target")
            drawn = next((draw for draw, tensor in self._uniform_draws if tensor is target), None)
            if drawn is not None:
                found.uniform_noise_target = (name, drawn, tuple(target.shape))
        if name in (*REGRESSION, "binary_cross_entropy", "binary_cross_entropy_with_logits") \
                and found.vanishing_targets is None and found.off_map_targets is None:
            self._dense_targets(argument(args, kwargs, 1, "target"))

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
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    findings = []
    if found.transposed_1d:
        findings.append(Finding(
            "TRANSPOSE_1D", "error",
            f"the step transposes a 1-D tensor with .T (shape {found.transposed_1d[0]}), which returns it unchanged: "
            "labels == labels.T then compares each label with itself, all True, so a same-label (B, B) mask built "
            "that way broadcast against (B, B) scores marks every pair as positive",
            "Build pairwise masks from explicit axes: labels[:, None] == labels[None, :] (or labels.unsqueeze(1) == "
            "labels.unsqueeze(0)); .T only transposes 2-D tensors.",
        ))
    if found.meshgrid_default:
        sizes = " x ".join(str(size) for size in found.meshgrid_default[0])
        findings.append(Finding(
            "MESHGRID_INDEXING", "warning",
            f"torch.meshgrid is called without indexing= (grids of {sizes}): torch's default is indexing='ij', where "
            "the first grid varies along the rows, while NumPy's np.meshgrid(xs, ys) is 'xy', where the x grid "
            "varies along the columns. Code written in NumPy's order gets x and y swapped: coordinates read from "
            "such grids (a soft-argmax, a coordinate embedding) come out transposed",
            "Pass the indexing explicitly: torch.meshgrid(xs, ys, indexing='xy') for x along the columns (NumPy's "
            "order), or indexing='ij' with (ys, xs) for row-major grids.",
        ))
    if found.vanishing_targets is not None:
        shape, share, largest = found.vanishing_targets
        findings.append(Finding(
            "TARGET_MAPS_VANISH", "warning",
            f"{share:.0%} of the batch's {shape} target maps peak below {TINY:g} without being zero (the largest value "
            f"in the batch is {largest:.2g}): the targets are practically empty maps, so the model learns to output "
            "zeros everywhere. A Gaussian heatmap drawn with a sigma meant for another unit does this: sigma=0.05 "
            "(for coordinates normalised to [0, 1]) on a grid in pixels makes exp(-d^2 / (2 sigma^2)) vanish at "
            "every pixel",
            "Draw the targets in the grid's own units (sigma of 1-3 pixels for a heatmap in pixels, or scale the "
            "normalised sigma by the map size) and check that each target map peaks near 1.",
        ))
    if found.off_map_targets is not None:
        shape, share, zero = found.off_map_targets
        size = f"{shape[-2]}x{shape[-1]}"
        findings.append(Finding(
            "TARGET_MAPS_VANISH", "warning",
            f"{share:.0%} of the non-empty {shape} target heatmaps peak below {OFF_MAP_PEAK:g} on the border of "
            f"the map ({zero:.0%} are all zero): their Gaussians are centred outside the {size} map, so most "
            "targets are empty or a faint edge and the model learns to output near-zero maps. Keypoints given in "
            "the input image's pixels but drawn on a heatmap at a lower resolution (a stride of 4: a 32x32 input, "
            "an 8x8 map) do this",
            f"Draw each Gaussian at the keypoint's coordinates in the heatmap's own grid: divide by the stride "
            f"(x_map = x * {shape[-1]} / input_width, y_map = y * {shape[-2]} / input_height) before drawing, and "
            "check that each visible keypoint's map peaks near 1.",
        ))
    if found.uniform_noise_target is not None:
        function, drawn, shape = found.uniform_noise_target
        findings.append(Finding(
            "NOISE_NOT_GAUSSIAN", "warning",
            f"{function}'s target is a {shape} tensor drawn in the step with torch.{drawn} (uniform on [0, 1), mean "
            "0.5, never negative): the model is trained to predict uniform noise. A denoising or diffusion objective "
            "(x_t = a * x + s * noise, loss = mse(model(x_t, t), noise)) assumes standard normal noise, which the "
            "forward process and the sampler use: noise drawn with rand_like where randn_like was meant trains a "
            "predictor for a noise law generation never sees",
            f"Draw the noise with torch.randn_like(x) (torch.randn(...)), not torch.{drawn}.",
        ))
    if found.masked_with_zero is not None:
        shape, how = found.masked_with_zero
        findings.append(Finding(
            "MASK_FILLED_WITH_ZERO", "warning",
            f"the {shape} scores going into a softmax are masked with {how}: the masked positions keep score 0, "
            "which the softmax still weights (e^0 is as much as an average score gets), so the padding or the "
            "positions meant to be hidden keep a share of the attention, a large one in short, heavily padded rows",
            "Fill the masked scores with -inf before the softmax: scores.masked_fill(~keep, float('-inf')) (or "
            "torch.finfo(scores.dtype).min), never 0; a 0/1 mask multiplies the weights after the softmax, followed "
            "by renormalising, not the scores.",
        ))
    if found.softmax_off_axis is not None:
        shape, dim, summed = found.softmax_off_axis
        findings.append(Finding(
            "SOFTMAX_OFF_AXIS", "warning",
            f"attention weights of shape {shape} come straight out of a softmax over dim {dim} and are then "
            f"multiplied into a matmul that sums over dim {summed}: each output mixes the values with weights that "
            f"do not sum to 1 over what it sums, while they do over dim {dim}. softmax(q @ k.transpose(-2, -1), "
            "dim=1) on (B, T_queries, T_keys) scores normalises over the queries; averaged over the queries "
            "afterwards, the attention then has no effect at all",
            "Normalise over the axis the matmul sums over, the keys: softmax(scores, dim=-1) before weights @ v "
            f"(dim {summed} of these {shape} weights).",
        ))
    if found.weighted_sum_off_axis is not None:
        shape, softmax_dim, softmax_size, summed, summed_size = found.weighted_sum_off_axis
        findings.append(Finding(
            "SOFTMAX_OFF_AXIS", "warning",
            f"a weighted sum (p * values).sum(dim={summed}) over {summed_size} entries takes its weights p straight "
            f"from a softmax over dim {softmax_dim} (size {softmax_size}): the weights sum to 1 over dim "
            f"{softmax_dim}, not over the {summed_size} entries summed, so the result is no average of the values. "
            f"In a soft-argmax over (N, K, H*W) heatmaps, F.softmax(h, dim=1) normalises across the K keypoints at "
            "each pixel instead of across each heatmap's pixels, and the 'expected coordinates' add up hundreds of "
            "pixels and cannot reach the targets",
            f"Normalise over the axis the sum runs over: F.softmax(h, dim={summed - len(shape)}) (dim=-1 for the "
            "pixels of flattened heatmaps) before (p * grid).sum(-1).",
        ))
    if found.embedding_dim_pooled is not None:
        name, shape = found.embedding_dim_pooled
        findings.append(Finding(
            "EMBEDDING_DIM_POOLED", "warning",
            f"a {name} over the embedding axis (dim 2, the last) of a {shape} embedding lookup (batch, tokens, "
            "embedding): each token's "
            f"{shape[2]}-dim vector is collapsed to one number, where the tokens were to be pooled into a document "
            "vector (dim=1). What the model gets is one value per position, not what the words mean"
            + (f"; it only runs because the sequence length equals the embedding size ({shape[1]})"
               if shape[1] == shape[2] else ""),
            f"Pool over the tokens: e.{name}(dim=1) of the (batch, tokens, {shape[2]}) embeddings (with a padding "
            "mask: (e * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)).",
        ))
    if found.overlap_on_raw_scores is not None:
        shape, low, high = found.overlap_on_raw_scores
        findings.append(Finding(
            "OVERLAP_ON_LOGITS", "error",
            f"a soft overlap loss (Dice, IoU, Tversky) is computed on raw scores: the step multiplies the model's "
            f"{shape} output, which holds values in [{low:.3g}, {high:.3g}] with no sigmoid or softmax in front, with "
            "a 0/1 mask and sums that output alone, as 2 * sum(p * mask) / (sum(p) + sum(mask)) does with "
            "probabilities. On logits sum(p) can be negative: the denominator crosses zero, the loss explodes or "
            "flips sign, and its optimum is no longer the mask",
            "Turn the logits into probabilities first: p = torch.sigmoid(logits) (softmax over the classes for "
            "several), then inter = (p * mask).sum(); dice = (2 * inter + smooth) / (p.sum() + mask.sum() + smooth).",
        ))
    if found.einsum_private is not None:
        equation, letters = found.einsum_private
        findings.append(Finding(
            "EINSUM_NOT_CONTRACTED", "error",
            f"torch.einsum('{equation}') names the axes {letters} in one operand each and nowhere else: einsum sums "
            "each such axis inside its own operand first, so the result is a product of sums, sum(u) * sum(v), not a "
            "dot product. Two letters written for what is one shared axis ('bd,be->b' for the factors of a user "
            "and an item) do this: the interaction cannot be fitted",
            "Use the same letter for the axis the operands share and contract: torch.einsum('bd,bd->b', u, v) (or "
            "(u * v).sum(-1)).",
        ))
    if found.sort_last is not None:
        shape = found.sort_last
        findings.append(Finding(
            "SORT_ALONG_LAST_DIM", "warning",
            f"the step sorts a {shape} tensor along its last dim of {shape[-1]} (torch.sort's default dim=-1), while "
            f"dim 1 holds {shape[1]} entries: the values inside each point (its x, y, z coordinates or channels) are "
            "reordered, so which value was which is lost, where ordering the points (canonicalising a set) was meant",
            "Sort along the points' axis: torch.sort(x, dim=1) by a key, e.g. idx = x[..., 0].argsort(dim=1); "
            "x.gather(1, idx[..., None].expand_as(x)) keeps each point whole.",
        ))
    if found.gather_rows is not None:
        (rows, columns), index = found.gather_rows
        findings.append(Finding(
            "GATHER_ALONG_BATCH", "error",
            f"the step calls gather(0, index) on a ({rows}, {columns}) tensor with a {index} index whose values are "
            f"all below {columns}: along dim 0 each output reads the ROW (sample) the index names, so every sample "
            f"gets the score of one of the batch's first {columns} samples. Per-sample ids (the taken action, the "
            "class) pick a column: q.gather(1, a.unsqueeze(1)), the value of each sample's own action",
            "Gather along dim 1 (the actions or classes): q.gather(1, actions.unsqueeze(1)).squeeze(1), or "
            "q[torch.arange(len(q)), actions].",
        ))
    if found.label_smoothing is not None:
        smoothing, classes = found.label_smoothing
        kept = 1 - smoothing + smoothing / classes
        findings.append(Finding(
            "LABEL_SMOOTHING_TOO_HIGH", "warning",
            f"cross_entropy runs with label_smoothing={smoothing:g} over {classes} classes: the target gives the true "
            f"class {kept:.2f} and spreads the rest over the others, nearly uniform soft targets, so the model is "
            "trained to be unsure and its accuracy suffers. label_smoothing is the share taken from the true class "
            f"(0.1 is usual); a confidence of {smoothing:g} for the true class is label_smoothing={1 - smoothing:.2g}",
            f"Set label_smoothing={1 - smoothing:.2g} (or 0.1): it is the mass moved off the true class, not the "
            "confidence kept on it.",
        ))
    if found.kl_div_mean is not None:
        shape = tuple(found.kl_div_mean)
        findings.append(Finding(
            "KL_DIV_MEAN_REDUCTION", "warning",
            f"kl_div (nn.KLDivLoss) runs with reduction='mean' (its default) on {shape} inputs: 'mean' divides the "
            f"summed divergence by every element, the batch times the {shape[-1]} classes, so the loss and its "
            f"gradients are {shape[-1]} times smaller than the KL divergence per sample and a distillation term "
            "barely trains (torch keeps 'mean' only for backward compatibility)",
            "Use reduction='batchmean' (nn.KLDivLoss(reduction='batchmean')): the sum over classes averaged over "
            "the batch, the KL divergence as defined; scale a distillation term by T**2 as usual.",
        ))
    if found.detached_prediction is not None:
        name, shape = found.detached_prediction
        findings.append(Finding(
            "PREDICTION_DETACHED", "warning",
            f"{name} gets a prediction (its first argument, {shape}) cut from the graph while its target requires "
            "grad: the stop-gradient sits on the wrong side, so the gradient flows only into what produced the "
            "target and pulls it towards the prediction. In TD learning, mse(V(s).detach(), r + gamma * V(s')) "
            "trains V(s') (the bootstrap target, next state) instead of V(s); or input and target were passed in the "
            "wrong order",
            "Detach the target, not the prediction: mse_loss(V(s), (r + gamma * V(s_next)).detach()) (the "
            "semi-gradient); pass criterion(prediction, target) in that order.",
        ))
    if found.teacher_trained is not None:
        findings.append(Finding(
            "TEACHER_TRAINED", "warning",
            f"kl_div's target distribution ({found.teacher_trained}, the teacher's softened probabilities) requires "
            "grad: the distillation term trains the teacher too, dragging it towards the student at every step, so "
            "the targets the student learns from drift away from what the teacher knew (the teacher's weights are in "
            "the optimizer, or its logits are not detached)",
            "Freeze the teacher: compute its logits under torch.no_grad() (or .detach() them), call "
            "teacher.requires_grad_(False) and build the optimizer over the student's parameters only. Mutual "
            "learning that trains both on purpose detaches each peer's target the same way.",
        ))
    if found.kl_div_probabilities is not None:
        findings.append(Finding(
            "KL_DIV_INPUT_NOT_LOG", "error",
            f"kl_div / nn.KLDivLoss gets its input ({found.kl_div_probabilities}) as probabilities (every row in [0, 1], "
            "summing to 1), but it reads its first argument as log-probabilities: it computes sum(target * (log(target) "
            "- input)), so with probabilities the loss is -sum(p_teacher * p_student) + const, which is lowest for a "
            "one-hot on the target's top class, not for matching the target distribution (and can go below zero)",
            "Pass log-probabilities as the input: kl(F.log_softmax(student_logits / T, -1), F.softmax(teacher_logits / "
            "T, -1)) (the target stays probabilities unless log_target=True).",
        ))
    if found.inverted_corners is not None:
        corners = found.inverted_corners
        findings.append(Finding(
            "BOX_CORNERS_UNORDERED", "warning",
            f"the step reads the {corners.shape} box targets as corners (x1, y1, x2, y2): it subtracts their first "
            f"two columns from the last two, as an IoU, GIoU or area term does, but in {corners.share:.0%} of them "
            "the 'second corner' lies left of or above the first. These boxes are not corners: most likely COCO's "
            "(x, y, width, height) or centre format (cx, cy, w, h), so every such box reads as empty or inverted, "
            "its area clamps to 0 and the IoU never rewards the right prediction",
            "Convert the targets to corners once, in the dataset or before the loss: "
            "torchvision.ops.box_convert(boxes, in_fmt='xywh', out_fmt='xyxy') (or 'cxcywh'), i.e. "
            "torch.cat([b[:, :2], b[:, :2] + b[:, 2:]], 1) for COCO boxes, so the head, the loss and the evaluation "
            "share one format.",
        ))
    if found.swapped_arguments is not None:
        name, shape = found.swapped_arguments
        expected = {"kl_div": "kl_div(student_log_probs, teacher_probs): the model's log-probabilities first "
                              "(F.log_softmax(logits / T, -1)), the fixed target distribution second",
                    "nll_loss": "nll_loss(log_probs, labels)",
                    "poisson_nll_loss": "poisson_nll_loss(log_rate, counts)"}.get(
            name, f"{name}(prediction, labels): the model's output first, the 0/1 labels second")
        findings.append(Finding(
            "PREDICTION_DETACHED", "error",
            f"{name} gets its first argument ({shape}) from outside the graph while its second, the target, requires "
            f"grad: the model's output was passed as the target. The two arguments play different parts, so the "
            "criterion computes something else than intended (labels read as logits, a divergence in the other "
            "direction) and the gradient reaches the model only through the target side",
            f"Pass the arguments in the criterion's order: {expected}.",
        ))
    return findings
