"""Shapes at the criterion: what an elementwise loss really averages when its input and
target shapes differ, and which dimension a class criterion's input was normalised over.

- Broadcasting: ``mse_loss``/``l1_loss``/``smooth_l1_loss``/``huber_loss`` broadcast a
  target of another shape (torch 2.13 only warns, and a warning filter or a log hides it;
  ``kl_div`` does not even warn; the binary losses raise, and ``shape_error_fix`` turns
  that error into the view to apply).
  A ``(B, 1)`` prediction against a ``(B,)`` target broadcasts to ``(B, B)``: every
  prediction is compared with every sample's target, and the model learns the batch mean.
  The bug is exactly "the broadcast shape is larger than both operands": a scalar or
  per-row target expanded over a prediction keeps the prediction's shape and is left alone.
  A hand-written loss (``((pred - y) ** 2).mean()``) calls no criterion; its arithmetic
  between a learnable ``(B, 1)`` column and a constant ``(B,)`` vector is the same bug.
- The normalisation dimension: ``nll_loss``/``cross_entropy`` read classes from dim 1
  (dim 0 of an unbatched input). Probabilities or log-probabilities normalised over
  another dim (``log_softmax(dim=1)`` of ``(B, T, C)`` logits, then a transpose) are
  neither raw logits nor the criterion's log-probabilities; saying "raw logits" sends the
  user to add a log_softmax over the class dim on top of the wrong one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_findings import Finding
    from optimus_preflight.preflight.analyses.loss_spy import ColumnBroadcast, CriterionCall

# Elementwise criteria that broadcast a target of another shape instead of raising
# (binary_cross_entropy and its logits variant raise a ValueError on torch 2.13).
# kl_div broadcasts without even a warning.
BROADCASTING_CRITERIA = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "gaussian_nll_loss")
CRITERION_MODULES = {"mse_loss": "MSELoss", "l1_loss": "L1Loss", "smooth_l1_loss": "SmoothL1Loss", "huber_loss": "HuberLoss",
                     "kl_div": "KLDivLoss", "gaussian_nll_loss": "GaussianNLLLoss"}
TOL = 1e-2  # half-precision values round; real logits never come this close by chance


def sums_to_one(values: torch.Tensor, dim: int) -> bool:
    """Probabilities along ``dim``: every slice sums to 1 (within half precision)."""
    sums = values.sum(dim=dim)
    return bool(torch.allclose(sums, torch.ones_like(sums), atol=TOL))


def log_sums_to_zero(values: torch.Tensor, dim: int) -> bool:
    """Log-probabilities along ``dim``: every slice's logsumexp is 0."""
    lse = torch.logsumexp(values, dim=dim)
    return bool(torch.allclose(lse, torch.zeros_like(lse), atol=TOL))


@dataclass
class WrongNormalisation:
    where: str  # "dim 2", or the sequence positions a flattened (B*T, C) input came from
    size: int
    kind: str  # "probabilities" | "log-probabilities"


def wrong_normalisation(values: torch.Tensor, shape: tuple[int, ...], class_dim: int,
                        sequences: list[tuple[int, int]], low: float, high: float) -> list[WrongNormalisation]:
    """Where ``values`` (the first rows of a criterion input of ``shape``, finite floats,
    not normalised over ``class_dim``) are normalised instead: another dim, or, for a
    flattened ``(B*T, C)`` input, the ``T`` positions of each of the batch's
    ``sequences`` ((rows, length) shapes), the trace of ``log_softmax(dim=1)`` on
    ``(B, T, C)`` logits before ``.view(-1, C)``. ``low``/``high``: the values' range
    (raw logits, both signs, are ruled out without another pass over a large tensor)."""
    if low < 0 and high > TOL:
        return []
    whole = values.shape[0] == shape[0]
    found = [WrongNormalisation(f"dim {dim}", shape[dim], kind) for dim, kind in normalised_dims(values, class_dim, low, high)
             if dim > 0 or whole]  # dim 0 only when no row was cut off: a partial column sums to anything
    if found or values.dim() != 2 or class_dim != 1:
        return found
    for rows, length in sequences:
        sequences_kept = min(rows, values.shape[0] // max(length, 1))
        if rows * length != shape[0] or length < 2 or sequences_kept < 1:
            continue
        grouped = values[:sequences_kept * length].reshape(sequences_kept, length, values.shape[1])
        for dim, kind in normalised_dims(grouped, 2, low, high):
            if dim == 1:
                where = (f"the {length} positions of each sequence (the (B, T, C) = ({rows}, {length}, "
                         f"{values.shape[1]}) tensor it was flattened from, dim 1)")
                return [WrongNormalisation(where, length, kind)]
    return found


def normalised_dims(values: torch.Tensor, class_dim: int, low: float, high: float) -> list[tuple[int, str]]:
    """(dim, "probabilities" | "log-probabilities") for each dim other than ``class_dim``
    along which ``values`` (finite floats in [``low``, ``high``]) are normalised."""
    found: list[tuple[int, str]] = []
    if values.numel() == 0:
        return found
    for dim in range(values.dim()):
        if dim == class_dim or values.shape[dim] < 2:
            continue
        if low >= 0 and sums_to_one(values, dim):
            found.append((dim, "probabilities"))
        elif high <= TOL and log_sums_to_zero(values, dim):
            found.append((dim, "log-probabilities"))
    return found


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


def broadcast_findings(calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_BROADCAST: an elementwise loss whose input and target broadcast to a shape
    larger than both, so it pairs every prediction with other samples' targets."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    found: list[Finding] = []
    for call in calls:
        if call.function not in BROADCASTING_CRITERIA or call.input is None or call.target_shape is None:
            continue
        prediction, target = call.input.shape, call.target_shape
        if prediction == target:
            continue
        if math.prod(prediction) == 1 and target and target[0] >= MIN_TARGET_ROWS:
            found.append(_one_prediction(call.function, prediction, target, call.input_op))
            continue
        result = broadcast_shape(prediction, target)
        if result is not None and len(prediction) == 2 and len(target) == 1 and prediction[0] == prediction[1] \
                == target[0] and target[0] >= MIN_TARGET_ROWS:
            found.append(_pair_matrix(call.function, prediction, target, call.input_op))
            continue
        if result is None or math.prod(result) <= max(math.prod(prediction), math.prod(target)):
            continue
        same_size = math.prod(prediction) == math.prod(target)
        view = (f"prediction.view_as(target) (here {_squeeze_hint(prediction, target)})" if same_size
                else "a prediction of the target's shape")
        found.append(Finding(
            "LOSS_BROADCAST", "error",
            f"{call.function} (nn.{CRITERION_MODULES[call.function]}) gets a prediction of shape {prediction} and a "
            f"target of shape {target}{_symbolic(prediction, target, result)}: they "
            f"broadcast to {result}, so the loss compares every prediction with every other sample's target "
            f"({math.prod(result)} terms instead of {max(math.prod(prediction), math.prod(target))}) and the "
            "model learns to predict the batch mean. torch only warns 'Using a target size ... different to "
            f"the input size'{_at(call.where)}",
            f"Give the criterion the prediction in the target's shape: {view}, or make the target the "
            "prediction's shape in the dataset.",
        ))
    return found


def _at(where: str | None) -> str:
    return f". The line: {where}" if where else ""


def _pair_matrix(function: str, prediction: tuple[int, ...], target: tuple[int, ...], op: str | None) -> Finding:
    """A (B, B) prediction against (B,) targets: a score for every pair of the batch (``u @ v.T``)
    where one per sample was meant; torch broadcasts each row against every target."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding  # noqa: F811  (a cycle at import time)

    made = f" (made by {op})" if op else ""
    if op in ELEMENTWISE_OPS:
        # A square out of an elementwise op is a (B,) term meeting a (B, 1) one, not a pair table.
        return Finding(
            "LOSS_BROADCAST", "error",
            f"{function} gets a square {prediction} prediction{made} against {target} targets: the model's score "
            f"{ELEMENTWISE_OPS[op]} a ({target[0]},) term and a ({target[0]}, 1) column, which broadcast to every "
            "pair of the batch's rows: a per-sample term kept as a column, such as a user or item bias looked up "
            "from nn.Embedding(n, 1) (self.user_bias(u) is (B, 1)) added to a (B,) dot product, or a reduction "
            "with keepdim=True. Row k then carries sample k's term against every other sample's score and target, "
            "so that term cannot be learned and the model learns the batch mean. torch only warns 'Using a target "
            "size ... different to the input size'",
            "Give every term the shape (B,) before combining them: squeeze(-1) the column (self.user_bias(u)"
            ".squeeze(-1), or drop keepdim=True), so the score has the target's shape.",
        )
    return Finding(
        "LOSS_BROADCAST", "error",
        f"{function} gets a square {prediction} prediction{made} against {target} targets: a score for every pair "
        f"of the batch's {target[0]} rows, where one score per sample was meant, such as user_vecs @ item_vecs.T "
        "(a matrix of every user with every item) for a row-wise dot product. The targets broadcast along each row, "
        "so every pair is fitted to the target of its column and the model learns the batch mean. torch only warns "
        "'Using a target size ... different to the input size'",
        "Score each sample with its own pair: (u * v).sum(-1) (or torch.einsum('bd,bd->b', u, v)), which gives "
        f"{target}; keep u @ v.T only for an in-batch softmax over the pairs with targets torch.arange(B).",
    )


# autograd nodes of elementwise ops: a square prediction they made came from broadcasting
ELEMENTWISE_OPS = {"AddBackward0": "adds", "SubBackward0": "subtracts", "MulBackward0": "multiplies"}
# A single prediction broadcast against this many targets is the whole batch pooled into one.
MIN_TARGET_ROWS = 4


def _one_prediction(function: str, prediction: tuple[int, ...], target: tuple[int, ...],
                    op: str | None = None) -> Finding:
    from optimus_preflight.preflight.analyses.loss_findings import Finding  # noqa: F811  (a cycle at import time)

    reduction = {"SumBackward0": "sum", "MeanBackward0": "mean"}.get(op or "")
    if reduction is not None:
        return Finding(
            "LOSS_ONE_PREDICTION", "error",
            f"{function} gets a single prediction, shape {prediction}, for a target of shape {target}: the model's "
            f"output ends in a .{reduction}() with no dim, which reduces the whole batch to one number (a dot product "
            f"(u * v).{reduction}() meant per row, a pooling over every element), and broadcasting compares that one "
            f"value with all {target[0]} targets: the model learns the targets' mean",
            f"Reduce over each sample's own axis only: (u * v).{reduction}(dim=1) (or dim=-1), so there is one "
            "prediction per sample, of the target's shape.",
        )
    return Finding(
        "LOSS_ONE_PREDICTION", "error",
        f"{function} gets a single prediction, shape {prediction}, for a target of shape {target}: broadcasting "
        f"compares that one value with all {target[0]} targets, so the model makes one output for the whole batch "
        "and learns the targets' mean. A readout that pools every sample of the batch together does this: a graph "
        "network's global pooling called without the batch vector (global_mean_pool(x, batch=None), or "
        "model(x, edge_index) where model(x, edge_index, batch) was meant, pools the nodes of all graphs into one "
        "vector), or a mean / sum over dim 0 instead of the features",
        "Keep one prediction per sample: pass the batch assignment vector to the graph readout "
        "(global_mean_pool(x, data.batch), model(data.x, data.edge_index, data.batch)), or pool over the "
        "sample's own axis (dim=1), so the prediction has the target's shape.",
    )


def _symbolic(prediction: tuple[int, ...], target: tuple[int, ...], result: tuple[int, ...]) -> str:
    """The shapes in the (N, 1) / (N,) notation people write, for the common one-column case."""
    rows = result[0] if result else 0
    names = {(rows, 1): "(N, 1)", (rows,): "(N,)"}
    if prediction in names and target in names and result == (rows, rows):
        return f" ({names[prediction]} against {names[target]}, to an (N, N) table for N = {rows})"
    # a size-1 channel on one side only: (N, 1, H, W) against (N, H, W) pairs every sample's map
    # with every other's
    for one, other, first in ((prediction, target, True), (target, prediction, False)):
        if len(one) == len(other) + 1 and len(other) in AXIS_NAMES and one[1] == 1 and one[:1] + one[2:] == other:
            axes = AXIS_NAMES[len(other)]
            with_one = "(" + ", ".join((axes[0], "1", *axes[1:])) + ")"
            without = "(" + ", ".join(axes) + ")"
            joint = "(" + ", ".join((axes[0], *axes)) + ")"
            pair = (with_one, without) if first else (without, with_one)
            return f" ({pair[0]} against {pair[1]}, to {joint} for N = {rows})"
    return ""


AXIS_NAMES = {2: tuple("nl".upper()), 3: tuple("nhw".upper()), 4: tuple("ndhw".upper())}
# (spelled lower case: upper-case string literals in the preflight source are read as finding codes)


def column_broadcast_findings(broadcasts: list[ColumnBroadcast], calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_BROADCAST for a hand-written loss: arithmetic between the prediction column
    ``(B, 1)`` and the batch's ``(B,)`` targets, which builds a ``(B, B)`` table of every
    prediction against every target before it is averaged."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    if not broadcasts or broadcast_findings(calls):
        return []
    found = broadcasts[0]
    rows = found.learnable_shape[0]
    squeeze = ("prediction.squeeze(-1)" if found.learnable_shape == (rows, 1) else
               "target.squeeze(-1)" if found.constant_shape == (rows, 1) else "prediction.view_as(target)")
    joint = found.joint_shape or (rows, rows)
    residual = found.op in ("sub", "__sub__", "__rsub__", "rsub")
    opening = "a residual in a hand-written loss combines" if residual else "compute_loss combines"
    # the losses written by hand around such a residual, named next to the broadcast they suffer
    kinds = (" (in a squared or absolute error, Huber, a pinball/quantile loss max(q * e, (q - 1) * e) or a "
             "Gaussian NLL's (y - mu)**2 / var alike: only torch's own criteria check shapes)" if residual else "")
    if found.flag and not found.kept_reduction:
        return [Finding(
            "LOSS_BROADCAST", "error",
            f"compute_loss multiplies a tensor of shape {found.learnable_shape} computed by the model by a 0/1 "
            f"vector of shape {found.constant_shape} (binary labels, an event indicator or a row mask) (`{found.op}`): "
            f"they broadcast to {joint}, so each sample's term is weighted by every other sample's 0/1 value instead "
            "of its own: summed over the table, every term counts once per 1 in the batch, those whose own value is "
            "0 (a censored subject, a negative, a masked row) included, and the 0/1 selects nothing. In a Cox partial "
            "likelihood, (risk - log_cumsum_exp(risk)) * event with risk of shape (B, 1) counts every subject as an "
            "event" + _at(found.where),
            f"Give both one shape before the multiplication: {squeeze} (risk = model(x).squeeze(-1)), so each "
            "sample's term is multiplied by its own flag.",
        )]
    if found.from_inputs:
        return [Finding(
            "LOSS_BROADCAST", "error",
            f"a residual in a hand-written loss combines a tensor of shape {found.learnable_shape} computed by the "
            f"model (its output or a derivative of it, as a PDE residual's u_xx) with a tensor of shape "
            f"{found.constant_shape} computed from the same input points without the model (a source or forcing "
            f"term f(x), a right-hand side) (`{found.op}`): the residual broadcasts to {joint}, an (N, N) table "
            f"pairing every point's derivative with every other point's forcing for N = {rows}, so the network "
            "fits the mean forcing instead of the equation at each point" + _at(found.where),
            "Give the source term the column shape before the arithmetic: f = f.unsqueeze(1) (or compute it from "
            "x[:, :1], keeping (N, 1)); assert residual.shape == u.shape.",
        )]
    return [Finding(
        "LOSS_BROADCAST", "error",
        f"{opening} a tensor of shape {found.learnable_shape} computed by the model with a tensor of "
        f"shape {found.constant_shape} that is not (the batch's targets or labels read as a column, or a constant) "
        f"(`{found.op}`): they broadcast to {joint}{kinds}, a table over (B, B) for B = {rows}, so every prediction is "
        f"compared with every target of the batch ({rows} times the terms) and the model learns to predict the "
        "batch mean"
        + (f". The {found.learnable_shape} column is {found.kept_reduction} taken with keepdim=True (F.pairwise_distance"
           "(a, b, keepdim=True), x.norm(dim=1, keepdim=True)): against (B,) pair labels every distance is scored "
           "against every pair's label" if found.kept_reduction else "") + _at(found.where),
        f"Give both one shape before the arithmetic: {squeeze} (or target.view_as(prediction))"
        + ("; or drop keepdim=True from the reduction." if found.kept_reduction else "."),
    )]


def shape_error_fix(calls: list[CriterionCall]) -> str | None:
    """The fix for a step that raised inside a criterion given one prediction per target in
    another shape (binary_cross_entropy's 'target size ... different to the input size')."""
    for call in calls:
        if call.error is None or call.input is None or call.target_shape is None:
            continue
        prediction, target = call.input.shape, call.target_shape
        if call.function in ("cross_entropy", "nll_loss") and len(prediction) >= 2:
            wanted = prediction[:1] + prediction[2:]  # the input without its class dim
            if target == (*wanted, 1):
                return (f"{call.function} got class-index targets of shape {target} for an input of shape "
                        f"{prediction}: it wants {wanted}, one index per sample (position); pass "
                        "target.squeeze(-1) (labels stored as a column).")
            continue
        if prediction != target and math.prod(prediction) == math.prod(target):
            return (f"{call.function} got a prediction of shape {prediction} and a target of shape {target}: give it "
                    f"one shape, {_squeeze_hint(prediction, target)} (prediction.view_as(target)).")
    return None


def _squeeze_hint(prediction: tuple[int, ...], target: tuple[int, ...]) -> str:
    if len(prediction) == len(target) + 1 and prediction[-1] == 1:
        return "prediction.squeeze(-1)"
    if len(target) == len(prediction) + 1 and target[-1] == 1:
        return "target.squeeze(-1), or prediction.unsqueeze(-1)"
    if len(prediction) == len(target) + 1 and prediction[1] == 1 and prediction[:1] + prediction[2:] == target:
        return "prediction.squeeze(1), dropping the size-1 channel"
    if len(target) == len(prediction) + 1 and target[1] == 1 and target[:1] + target[2:] == prediction:
        return "prediction.unsqueeze(1), or target.squeeze(1)"
    return f"prediction.view({', '.join(str(n) for n in target)})"


def _example(wrong: WrongNormalisation) -> str:
    if wrong.where == "dim 0":
        return "dim=0 normalises each class over the batch"
    return "e.g. dim=1 of (B, T, C) logits, which is T"


def norm_dim_findings(calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_NORM_DIM: a class criterion's input normalised over a dim that is not its
    class dim (a softmax/log_softmax with the wrong ``dim=``)."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    found: list[Finding] = []
    for call in calls:
        stats = call.input
        if stats is None or not stats.wrong_dims or call.n_classes is None:
            continue
        wrong = stats.wrong_dims[0]
        class_dim = 1 if len(stats.shape) >= 2 else 0
        found.append(Finding(
            "LOSS_NORM_DIM", "error",
            f"{call.function} gets an input of shape {stats.shape} that holds {wrong.kind} normalised over "
            f"{wrong.where} (size {wrong.size}), but {call.function} reads the {call.n_classes} classes from dim "
            f"{class_dim}: a softmax/log_softmax ran over the wrong dimension ({_example(wrong)}), so each "
            "sample's class scores are not a distribution and the loss trains the wrong thing",
            (f"Normalise over the class dimension, the one of size {call.n_classes}: F.log_softmax(logits, dim=-1) "
             "on (B, T, C) logits (dim=1 on (B, C) ones), then move the classes to dim 1 for the criterion "
             "(logits.transpose(1, 2) or .reshape(-1, C)).") if call.function == "nll_loss" else
            (f"Remove the softmax/log_softmax: cross_entropy applies log_softmax itself over dim {class_dim}, "
             f"the class dimension (size {call.n_classes}); pass the raw logits with the classes at dim 1 "
             "(logits.transpose(1, 2) or .reshape(-1, C))."),
        ))
    return found


@dataclass
class KlNormalisation:
    """kl_div's input normalised over another dim than its target's distributions."""

    shape: tuple[int, ...]
    target_dim: int  # where the target's distributions run (the last dim)
    wrong: WrongNormalisation
    # True: the input's log-probabilities run over the last dim and the *target* was
    # normalised over ``wrong`` (a teacher's softmax over the time axis of (B, T, C) logits)
    wrong_side_target: bool = False


def kl_wrong_dims(inputs: torch.Tensor, target: torch.Tensor, log_target: bool, rows: int) -> KlNormalisation | None:
    """For ``kl_div(input, target)``: where the target holds distributions over its last dim
    (probabilities, or log-probabilities with ``log_target``) and ``input`` holds
    log-probabilities over another dim instead, the one it was normalised over
    (``F.log_softmax(student_logits / T, dim=0)`` in a distillation loss: over the batch)."""
    if inputs.dim() < 2 or inputs.shape != target.shape or inputs.shape[-1] < 2:
        return None
    last = inputs.dim() - 1
    with torch.no_grad():
        values, wanted = inputs.detach()[:rows].float(), target.detach()[:rows].float()
        if not (bool(torch.isfinite(values).all()) and bool(torch.isfinite(wanted).all())):
            return None
        low, high = float(values.min()), float(values.max())
        whole = values.shape[0] == inputs.shape[0]
        if not (log_sums_to_zero(wanted, last) if log_target else float(wanted.min()) >= 0 and sums_to_one(wanted, last)):
            return _target_normalised_elsewhere(values, wanted, log_target, last, high, whole)
        if high <= TOL and log_sums_to_zero(values, last):
            return None  # log-probabilities over the target's dim: right
        for dim, kind in normalised_dims(values, last, low, high):
            if kind == "log-probabilities" and (dim > 0 or whole):
                return KlNormalisation(tuple(inputs.shape), last, WrongNormalisation(f"dim {dim}", inputs.shape[dim], kind))
    return None


def _target_normalised_elsewhere(values: torch.Tensor, wanted: torch.Tensor, log_target: bool, last: int,
                                 high: float, whole: bool) -> KlNormalisation | None:
    """The input's log-probabilities run over the last dim (the classes) while the target's
    distributions run over another dim only: the target's softmax took the wrong ``dim``."""
    if not (high <= TOL and log_sums_to_zero(values, last)):
        return None
    low_t, high_t = float(wanted.min()), float(wanted.max())
    for dim, kind in normalised_dims(wanted, last, low_t, high_t):
        if (kind == "log-probabilities") == log_target and (dim > 0 or whole):
            return KlNormalisation(tuple(values.shape), last, WrongNormalisation(f"dim {dim}", values.shape[dim], kind),
                                   wrong_side_target=True)
    return None


def kl_norm_dim_findings(calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_NORM_DIM for kl_div: log-probabilities over the wrong dim."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    found: list[Finding] = []
    for call in calls:
        kl = call.kl_normalisation
        if kl is None:
            continue
        batch = " (the batch)" if kl.wrong.where == "dim 0" else ""
        if kl.wrong_side_target:
            dim = kl.wrong.where.removeprefix("dim ")
            found.append(Finding(
                "LOSS_NORM_DIM", "error",
                f"kl_div's target (shape {kl.shape}) holds {kl.wrong.kind} normalised over {kl.wrong.where}{batch}, "
                f"size {kl.wrong.size}, while its input's log-probabilities run over dim {kl.target_dim} (size "
                f"{kl.shape[kl.target_dim]}, the classes): the target's softmax ran over the wrong dimension "
                f"(softmax(teacher_logits / T, dim={dim})), so each sample's soft target is not a distribution over "
                "the classes and the student is pulled toward the wrong one",
                f"Normalise the target over the classes, like the input: F.softmax(teacher_logits / T, dim=-1) "
                f"(dim={kl.target_dim}), not dim={dim}.",
            ))
            continue
        found.append(Finding(
            "LOSS_NORM_DIM", "error",
            f"kl_div gets an input of shape {kl.shape} holding log-probabilities normalised over {kl.wrong.where}"
            f"{batch}, size {kl.wrong.size}, while its target's distributions run over dim {kl.target_dim} (size "
            f"{kl.shape[kl.target_dim]}): a log_softmax ran over the wrong dimension, so each sample's prediction is "
            "not a distribution and the divergence compares the wrong things",
            f"Take the log_softmax over the same dim as the target's softmax: F.log_softmax(logits / T, dim=-1) "
            f"(dim={kl.target_dim}), with the target softmax(teacher_logits / T, dim=-1).",
        ))
    return found
