"""Criterion arguments torch accepts without a word, and the wrong answers they give.

Fed every torch function call the loss spy sees during ``compute_loss``:

- ``CTC_BLANK_IN_TARGETS``: ``F.ctc_loss`` / ``nn.CTCLoss`` given targets that contain its
  blank index (``blank=0`` by default). Real CTC targets never hold the blank; torch checks
  nothing and returns a finite loss, reading each such label as "no symbol here". Usually
  the model reserves another index (the last class) and ``blank=`` was left at 0. Only the
  symbols inside ``target_lengths`` count: a padded ``(N, S)`` target may pad with 0.
- ``CTC_LENGTHS_TOO_SHORT``: ``ctc_loss`` given input_lengths shorter than the frames a tenth
  or more of its samples' targets need, infinite losses that ``zero_infinity=True`` hides
  (input lengths computed with another subsampling factor than the model's).
- ``CTC_NOT_LOG_PROBS``: ``ctc_loss`` given rows over the classes that are not
  log-probabilities (their logsumexp is not 0): raw logits or softmax output. CTC sums
  ``exp`` of path scores that it assumes are normalised; on raw logits every path can be
  made more likely at once, so the loss falls without bound (it goes negative) while the
  alignment learns nothing. torch checks nothing.
- ``POISSON_LOG_INPUT``: ``F.poisson_nll_loss`` / ``nn.PoissonNLLLoss`` with
  ``log_input=True`` (the default) on a prediction that comes out of a non-negative
  activation (Softplus, ReLU, exp, sigmoid, read from the graph as ``output_range`` does):
  the model outputs a rate, the loss reads it as log(rate), and the rate it fits is
  ``exp(output) >= 1``: no count below 1 (no zero) can be predicted.
- ``LOSS_INDEXED_BY_BATCH``: a hand-written NLL that picks each sample's score with
  ``log_probs[:, labels]``: advanced indexing of dim 1 of a ``(B, C)`` tensor with the
  batch's ``(B,)`` label vector returns ``(B, B)``, every sample's score for every label of
  the batch, and its mean/sum fits every sample to every label. Recorded when the index is
  ``(slice(None), t)`` with ``t`` equal to an integer ``(B,)`` tensor of the batch, and the
  ``(B, B)`` result reaches a ``mean``/``sum`` through elementwise ops only (a similarity
  matrix goes through a softmax or a cross_entropy; ``.diag()`` picks the right entries).
- ``LOSS_WEIGHTS_AFTER_MEAN``: per-sample weights multiplied into a criterion's output that
  is already reduced (``reduction='mean'``), ``(criterion(out, y) * w).mean()``
  (``loss_weights.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.call_args import argument
from optimus_preflight.preflight.analyses.loss_weights import (
    WeightsAfterMean,
    WeightsAfterMeanWatch,
    weights_after_mean_finding,
)
from optimus_preflight.preflight.analyses.output_range import output_activation
from optimus_preflight.preflight.analyses.squared_mean import (
    SquaredMean,
    SquaredMeanWatch,
    squared_mean_finding,
)
from optimus_preflight.training.batches import batch_size_of, leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_findings import Finding

# The activations whose output is never negative: exp(output) >= 1 under log_input=True.
NON_NEGATIVE = {"Softplus": "softplus", "Relu": "ReLU", "Exp": "exp", "Sigmoid": "sigmoid", "Softmax": "softmax",
                "Relu6": "ReLU6", "Hardsigmoid": "hardsigmoid"}
# exp of the activation's range: the rates a log_input=True loss can fit.
FITTED_RATES = {"sigmoid": "[1, e]", "softmax": "[1, e]", "hardsigmoid": "[1, e]", "ReLU6": "[1, e^6]"}
REDUCTIONS = ("mean", "sum", "nanmean", "nansum")
# Ops between the picked (B, B) matrix and its reduction that keep it a per-entry loss
# (negation, a log, a mask or weight): a softmax, log_softmax or cross_entropy over it is a
# similarity matrix's use, and stops the walk.
_ELEMENTWISE = ("Neg", "Mul", "Div", "Log", "Log1P", "Sub", "Rsub", "Add", "Pow", "Abs", "Clamp", "ClampMin",
                "ClampMax", "ToCopy", "Clone", "Alias", "MaskedFill", "Where", "Exp")
_WALK_NODES = 64


@dataclass
class CtcBlank:
    blank: int
    classes: int | None  # of the log-probabilities' last dim
    count: int  # target symbols equal to the blank, within target_lengths
    total: int  # target symbols within target_lengths
    target_max: int  # the largest label
    target_min: int
    # target_lengths all the padded width while the blanks only end rows: the padding counted as labels
    padding_counted: bool = False


@dataclass
class CtcNotLogProbs:
    kind: str  # "raw logits", "probabilities"
    logsumexp: float  # median over the rows: 0 for log-probabilities
    classes: int


@dataclass
class PoissonLogInput:
    activation: str  # "softplus"
    zero_share: float | None  # of the targets below 1 (counts of 0), which no fitted rate reaches


@dataclass
class BatchIndexed:
    shape: tuple[int, int]  # (B, C) of the tensor indexed
    distinct: int  # distinct labels of the batch
    reduction: str  # "mean", "sum"


@dataclass
class MultiHotIndices:
    shape: tuple[int, int]  # (B, C) of the target
    positives: float  # mean 1s per row: the tags the multi-hot vectors mean


def multi_hot_index_target(args: tuple, kwargs: dict) -> MultiHotIndices | None:
    """multilabel_margin_loss reads its target as class indices padded with -1; a 0/1 (B, C)
    multi-hot target with C > 2 and no -1 reads as 'classes 0 and 1' for every row."""
    target = argument(args, kwargs, 1, "target")
    if not isinstance(target, torch.Tensor) or target.dim() != 2 or target.shape[1] <= 2 or not target.numel():
        return None
    with torch.no_grad():
        values = target.detach()
        if not bool(((values == 0) | (values == 1)).all()) or not bool((values == 1).any()):
            return None
        return MultiHotIndices((int(values.shape[0]), int(values.shape[1])), float(values.float().sum(1).mean()))


@dataclass
class CriterionArgs:
    ctc_blank: CtcBlank | None = None
    ctc_not_log_probs: CtcNotLogProbs | None = None
    ctc_infeasible: CtcInfeasible | None = None
    multi_hot_indices: MultiHotIndices | None = None
    poisson_log_input: PoissonLogInput | None = None
    batch_indexed: BatchIndexed | None = None
    weights_after_mean: WeightsAfterMean | None = None
    squared_mean: SquaredMean | None = None


def _lengths(value: Any) -> list[int] | None:
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.detach().reshape(-1).tolist()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _ctc_target_rows(targets: torch.Tensor, lengths: list[int]) -> list[torch.Tensor] | None:
    """Each sample's target symbols of a ``ctc_loss`` call: row i of a padded (N, S) target cut
    to target_lengths[i], or the i-th run of a 1-D concatenation; None when they disagree."""
    values = targets.detach().long().cpu()
    if values.dim() == 2:
        if values.shape[0] != len(lengths):
            return None
        return [row[:max(0, n)] for row, n in zip(values, lengths, strict=True)]
    starts = [0, *torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist()[:-1]]
    return [values[start:start + max(0, n)] for start, n in zip(starts, lengths, strict=True)]


def ctc_blank_in_targets(args: tuple, kwargs: dict) -> CtcBlank | None:
    """The blank among the label symbols a ``ctc_loss`` call trains on (pure)."""
    log_probs, targets = argument(args, kwargs, 0, "log_probs"), argument(args, kwargs, 1, "targets")
    lengths = _lengths(argument(args, kwargs, 3, "target_lengths"))
    blank = argument(args, kwargs, 4, "blank", 0)
    if (not isinstance(targets, torch.Tensor) or targets.is_floating_point() or lengths is None
            or not isinstance(blank, int) or targets.dim() not in (1, 2)):
        return None
    with torch.no_grad():
        rows = _ctc_target_rows(targets, lengths)
        if rows is None:
            return None
        symbols = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
        if symbols.numel() == 0:
            return None
        count = int((symbols == blank).sum())
        if count == 0:
            return None
        classes = int(log_probs.shape[-1]) if isinstance(log_probs, torch.Tensor) and log_probs.dim() else None
        padded = targets.dim() == 2 and all(n == targets.shape[1] for n in lengths) and blank_only_ends_rows(rows, blank)
        return CtcBlank(blank, classes, count, int(symbols.numel()), int(symbols.max()), int(symbols.min()),
                        padding_counted=padded)


def blank_only_ends_rows(rows: list[torch.Tensor], blank: int) -> bool:
    """Whether the blank, in two rows or more, only ever forms a run that ends its row: the
    padding of a padded target batch, not a label numbered like the blank (pure)."""
    ended = 0
    for row in rows:
        is_blank = row == blank
        if bool(is_blank.any()):
            first = int(is_blank.nonzero()[0])
            if not bool(is_blank[first:].all()):
                return False
            ended += 1
    return ended >= 2


@dataclass
class CtcInfeasible:
    infeasible: int  # samples whose input_lengths are shorter than their targets need
    total: int
    zero_infinity: bool
    shortest_ratio: float  # the smallest input_length / needed frames among them
    frames: int | None  # T of the (T, N, C) log-probabilities
    longest_input: int  # the largest input_length of the call


INFEASIBLE_SHARE = 0.1  # of a CTC call's samples that no alignment can fit


def ctc_lengths_infeasible(args: tuple, kwargs: dict) -> CtcInfeasible | None:
    """Samples of a ``ctc_loss`` call whose input_lengths are shorter than the frames their
    targets need (one per symbol, plus a blank between repeated symbols): their loss is
    infinite, and ``zero_infinity=True`` silently turns it into 0 (pure)."""
    log_probs, targets = argument(args, kwargs, 0, "log_probs"), argument(args, kwargs, 1, "targets")
    inputs = _lengths(argument(args, kwargs, 2, "input_lengths"))
    lengths = _lengths(argument(args, kwargs, 3, "target_lengths"))
    zero_infinity = bool(argument(args, kwargs, 6, "zero_infinity", False))
    if not isinstance(targets, torch.Tensor) or inputs is None or lengths is None or len(inputs) != len(lengths) \
            or len(lengths) < 2 or targets.dim() not in (1, 2):
        return None
    with torch.no_grad():
        rows = _ctc_target_rows(targets, lengths)
        if rows is None:
            return None
        needed = [len(row) + int((row[1:] == row[:-1]).sum()) for row in rows]
    short = [(frames / need) for frames, need in zip(inputs, needed, strict=True) if need and frames < need]
    if len(short) < 2 or len(short) < INFEASIBLE_SHARE * len(lengths):
        return None
    frames = int(log_probs.shape[0]) if isinstance(log_probs, torch.Tensor) and log_probs.dim() == 3 else None
    return CtcInfeasible(len(short), len(lengths), zero_infinity, min(short), frames, max(inputs))


def ctc_not_log_probs(args: tuple, kwargs: dict) -> CtcNotLogProbs | None:
    """``ctc_loss``'s scores over the classes, when they are not log-probabilities (pure)."""
    log_probs = argument(args, kwargs, 0, "log_probs")
    if not isinstance(log_probs, torch.Tensor) or log_probs.dim() < 2 or log_probs.shape[-1] < 2 \
            or not log_probs.is_floating_point() or not log_probs.numel():
        return None
    with torch.no_grad():
        rows = log_probs.detach().float().reshape(-1, log_probs.shape[-1])
        if not bool(torch.isfinite(rows).all()):
            return None
        spread = float(torch.logsumexp(rows, dim=-1).abs().median())
        if spread < 1e-2:
            return None
        sums = rows.sum(-1)
        kind = ("probabilities (softmax output)" if bool((rows >= 0).all()) and bool(((sums - 1).abs() < 1e-3).all())
                else "raw logits")
        return CtcNotLogProbs(kind, float(torch.logsumexp(rows, dim=-1).median()), int(log_probs.shape[-1]))


def poisson_log_input(args: tuple, kwargs: dict) -> PoissonLogInput | None:
    """A ``poisson_nll_loss`` call with ``log_input=True`` on the output of a non-negative
    activation (pure)."""
    inputs, target = argument(args, kwargs, 0, "input"), argument(args, kwargs, 1, "target")
    if not bool(argument(args, kwargs, 2, "log_input", True)):
        return None
    if not isinstance(inputs, torch.Tensor) or not inputs.requires_grad:
        return None
    activation = NON_NEGATIVE.get(output_activation(inputs) or "")
    if activation is None:
        return None
    zero_share = None
    if isinstance(target, torch.Tensor) and target.numel():
        with torch.no_grad():
            zero_share = float((target.detach().float() < 1).float().mean())
    return PoissonLogInput(activation, zero_share)


def _reaches(node: Any, wanted: set[int], keep: list[Any]) -> bool:
    """``node`` is one of ``wanted`` (by id; ``keep`` holds them alive) or reaches one
    through elementwise ops only."""
    stack, seen = [node], 0
    while stack and seen < _WALK_NODES:
        current = stack.pop()
        seen += 1
        if id(current) in wanted and any(current is kept for kept in keep):
            return True
        name = type(current).__name__.removesuffix("Backward0").removesuffix("Backward1")
        if current is node or name in _ELEMENTWISE:
            stack.extend(parent for parent, _ in current.next_functions if parent is not None)
    return False


class CriterionArgsWatch:
    """Feed it every torch function call (``before`` and ``after``); ``found`` holds what it
    saw. ``watch_batch(batch)`` before each ``compute_loss`` names the label vectors."""

    def __init__(self) -> None:
        self.found = CriterionArgs()
        self._labels: list[torch.Tensor] = []  # the batch's integer (B,) tensors
        self._picks: list[tuple[Any, tuple[int, int], int]] = []  # (grad_fn of a (B, B) pick, (B, C), distinct)
        self._weights = WeightsAfterMeanWatch()  # per-sample weights times a reduced loss
        self._squares = SquaredMeanWatch()  # a residual averaged before it is squared

    def watch_batch(self, batch: Any) -> None:
        self._labels = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() == 1
                        and leaf.numel() >= 2 and not leaf.is_floating_point() and not leaf.is_complex()
                        and leaf.dtype != torch.bool]
        self._picks = []
        self._weights.start(batch_size_of(batch) or None)
        self._squares.start()

    def before(self, name: str, args: tuple, kwargs: dict) -> None:
        found = self.found
        if name == "ctc_loss":
            found.ctc_blank = found.ctc_blank or ctc_blank_in_targets(args, kwargs)
            found.ctc_not_log_probs = found.ctc_not_log_probs or ctc_not_log_probs(args, kwargs)
            found.ctc_infeasible = found.ctc_infeasible or ctc_lengths_infeasible(args, kwargs)
        elif name == "multilabel_margin_loss" and found.multi_hot_indices is None:
            found.multi_hot_indices = multi_hot_index_target(args, kwargs)
        elif name == "poisson_nll_loss" and found.poisson_log_input is None:
            found.poisson_log_input = poisson_log_input(args, kwargs)
        elif name in REDUCTIONS and self._picks and found.batch_indexed is None and args:
            self._reduced(name, args[0])

    def after(self, name: str, args: tuple, out: Any, kwargs: dict | None = None) -> None:
        if self.found.weights_after_mean is None:
            self._weights.observe(name, args, kwargs or {}, out)
            self.found.weights_after_mean = self._weights.found
        self._squares.observe(name, args, kwargs or {}, out)
        self.found.squared_mean = self._squares.found
        if name == "__getitem__" and self._labels and self.found.batch_indexed is None and len(args) == 2:
            self._indexed(args[0], args[1], out)

    def _indexed(self, source: Any, index: Any, out: Any) -> None:
        if not (isinstance(source, torch.Tensor) and source.dim() == 2 and source.requires_grad
                and isinstance(index, tuple) and len(index) == 2 and isinstance(index[0], slice) and index[0] == slice(None)
                and isinstance(index[1], torch.Tensor) and isinstance(out, torch.Tensor) and out.grad_fn is not None):
            return
        picked, rows = index[1], int(source.shape[0])
        if picked.dim() != 1 or picked.numel() != rows or tuple(out.shape) != (rows, rows) or picked.is_floating_point():
            return
        with torch.no_grad():
            if not any(label.shape == picked.shape and torch.equal(label.to(picked.device).long(), picked.long())
                       for label in self._labels):
                return
            distinct = int(picked.unique().numel())
        self._picks.append((out.grad_fn, (rows, int(source.shape[1])), distinct))

    def _reduced(self, name: str, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2 or tensor.grad_fn is None:
            return
        for node, shape, distinct in self._picks:
            if tuple(tensor.shape) == (shape[0], shape[0]) and _reaches(tensor.grad_fn, {id(node)}, [node]):
                self.found.batch_indexed = BatchIndexed(shape, distinct, name)
                self._picks = []  # the graph nodes are not held past the finding
                return


def criterion_arg_findings(found: CriterionArgs | None) -> list[Finding]:
    """CTC_BLANK_IN_TARGETS, CTC_NOT_LOG_PROBS, POISSON_LOG_INPUT, LOSS_INDEXED_BY_BATCH, LOSS_WEIGHTS_AFTER_MEAN."""
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    if found is None:
        return []
    out: list[Finding] = []
    if (ctc := found.ctc_blank) is not None and ctc.padding_counted:
        out.append(Finding(
            "CTC_BLANK_IN_TARGETS", "error",
            f"ctc_loss gets target_lengths equal to the padded width of the target tensor for every sample, and "
            f"the {ctc.count} target symbols equal to the blank ({ctc.blank}) only ever end a row: the padding is "
            "counted as labels. The target lengths include the padding, so CTC is trained to emit the padding id "
            "as extra symbols after every transcript (the blank, which CTC reads as 'no symbol', or the padding "
            "token), and samples whose padded target no longer fits their frames train nothing",
            "Pass each sequence's true length: target_lengths = torch.tensor([len(t) for t in transcripts]) (or "
            f"(targets != {ctc.blank}).sum(1) when no label uses the padding id), not targets.shape[1] for every row.",
        ))
    elif ctc is not None:
        out.append(Finding("CTC_BLANK_IN_TARGETS", "error", _ctc_message(ctc), _ctc_fix(ctc)))
    if (short := found.ctc_infeasible) is not None and not (ctc is not None and ctc.padding_counted):
        out.append(_ctc_infeasible_finding(short))
    if (scores := found.ctc_not_log_probs) is not None:
        out.append(Finding(
            "CTC_NOT_LOG_PROBS", "error",
            f"ctc_loss receives {scores.kind}, not log-probabilities: each time step's {scores.classes} scores have a "
            f"logsumexp of {scores.logsumexp:.3g} (0 after log_softmax). CTC adds up exp(score) over every alignment "
            "as if each step were normalised, so the model can raise every path at once: the loss falls without bound "
            "(it turns negative) while the alignment of labels to frames learns nothing",
            "Apply log_softmax over the classes before CTC: log_probs = logits.log_softmax(dim=-1) (then "
            ".transpose(0, 1) to the (T, N, C) layout nn.CTCLoss expects).",
        ))
    if (multi := found.multi_hot_indices) is not None:
        rows, classes = multi.shape
        out.append(Finding(
            "MULTILABEL_MARGIN_MULTI_HOT", "error",
            f"multilabel_margin_loss gets a ({rows}, {classes}) target of 0s and 1s (a multi-hot vector, {multi.positives:.1f} "
            "tags per row), but MultiLabelMarginLoss reads its target as a list of class INDICES padded with -1: a row "
            "[0, 1, 0, 0, 1, ...] means 'classes 0 and 1', so every sample is trained as tagged with classes 0 and 1 "
            "and nothing else, whatever its real tags",
            "For multi-hot targets use nn.BCEWithLogitsLoss (or nn.MultiLabelSoftMarginLoss) on the 0/1 vectors; to keep "
            "MultiLabelMarginLoss, convert each row to its tag indices followed by -1 padding.",
        ))
    if (poisson := found.poisson_log_input) is not None:
        rates = FITTED_RATES.get(poisson.activation, "[1, inf)")
        zeros = (f"; {poisson.zero_share:.0%} of the targets are below 1 (zero counts), which it can never fit"
                 if poisson.zero_share else "")
        out.append(Finding(
            "POISSON_LOG_INPUT", "warning",
            f"poisson_nll_loss runs with log_input=True (PoissonNLLLoss's default) on a prediction that comes out of "
            f"a {poisson.activation}: the model outputs a non-negative rate, but the loss reads its input as "
            f"log(rate) and computes exp(input) - target * input, so the rate it fits is exp(output), in {rates}: "
            f"never below 1{zeros}. At inference the output is then a log-rate, not the rate the head was built for",
            f"Pass the rate as a rate: nn.PoissonNLLLoss(log_input=False) (F.poisson_nll_loss(..., log_input=False)), "
            f"or drop the {poisson.activation} after the last layer and keep log_input=True (the output is then the "
            "log-rate: predict with exp(output)).",
        ))
    if (indexed := found.batch_indexed) is not None:
        rows, classes = indexed.shape
        out.append(Finding(
            "LOSS_INDEXED_BY_BATCH", "error",
            f"the loss picks class scores with scores[:, labels]: advanced indexing of dim 1 of the ({rows}, {classes}) "
            f"tensor with the batch's ({rows},) label vector returns a ({rows}, {rows}) matrix, every sample's score "
            f"for every label of the batch, and its {indexed.reduction} trains each sample towards all "
            f"{indexed.distinct} labels of its batch, not its own (only the diagonal, 1 entry in {rows}, is right): "
            "the model learns the batch's label frequencies, not the inputs",
            "Pick one score per sample: log_probs[torch.arange(len(labels)), labels] or "
            "log_probs.gather(1, labels[:, None]).squeeze(1); or use F.nll_loss(log_probs, labels) "
            "(F.cross_entropy on raw logits).",
        ))
    if found.weights_after_mean is not None:
        out.append(weights_after_mean_finding(found.weights_after_mean))
    if found.squared_mean is not None:
        out.append(squared_mean_finding(found.squared_mean))
    return out


def _ctc_infeasible_finding(short: CtcInfeasible) -> Any:
    from optimus_preflight.preflight.analyses.loss_findings import Finding

    hidden = ("zero_infinity=True turns their infinite losses into 0, so they train nothing and nothing says so"
              if short.zero_infinity else "their losses are infinite")
    frames = ""
    if short.frames and short.longest_input <= 0.6 * short.frames:
        frames = (f"; the longest input_length is {short.longest_input} of the {short.frames} frames the model "
                  "outputs, so the rest of every utterance is never aligned either")
    return Finding(
        "CTC_LENGTHS_TOO_SHORT", "warning",
        f"ctc_loss gets input_lengths shorter than the targets need in {short.infeasible} of its {short.total} "
        f"samples (down to {short.shortest_ratio:.0%} of the frames needed: one per symbol, plus a blank between "
        f"repeats): no alignment fits them and {hidden}{frames}. input_lengths must count the model's output "
        "frames, after its convolution strides or pooling (subsampling), not the input's frames or another "
        "recipe's factor",
        "Compute input_lengths with the front end's own output-length formula: for each strided Conv1d, "
        "(L + 2 * padding - dilation * (kernel_size - 1) - 1) // stride + 1 (e.g. (L + 1) // 2 for kernel 3, "
        "padding 1, stride 2); keep zero_infinity=False while checking, so impossible samples show as inf.",
    )


def _ctc_message(ctc: CtcBlank) -> str:
    return (
        f"ctc_loss runs with blank={ctc.blank}, but {ctc.count} of the {ctc.total} target symbols "
        f"({ctc.count / ctc.total:.0%}) are {ctc.blank}, labels in [{ctc.target_min}, {ctc.target_max}]"
        + (f" over {ctc.classes} classes" if ctc.classes else "")
        + ": the blank's index is also a real label (a character vocabulary numbered from 0, "
        "{c: i for i, c in enumerate(chars)}, gives its first character the blank's id). CTC reads every label "
        "equal to the blank as 'no symbol here', so that class is never learned and the alignments around it are "
        "wrong. Real CTC targets never contain the blank; torch checks nothing and returns a finite loss"
    )


def _ctc_fix(ctc: CtcBlank) -> str:
    last = ctc.classes - 1 if ctc.classes else None
    if last is not None and ctc.blank != last and ctc.target_max < last:
        return (f"Give CTC the index the model reserves for the blank: nn.CTCLoss(blank={last}) "
                f"(F.ctc_loss(..., blank={last})) when the labels are 0..{last - 1} and class {last} is the blank; "
                f"or shift the labels by one (labels + 1) so that class {ctc.blank} stays free for the blank.")
    if ctc.blank != 0 and ctc.target_min > 0:
        return ("Give CTC the index the model reserves for the blank: nn.CTCLoss(blank=0) (F.ctc_loss(..., "
                "blank=0)) when the labels start at 1 and class 0 is the blank.")
    more = f" ({ctc.classes + 1} outputs)" if ctc.classes else ""
    return ("No class is left for the blank: the labels use both ends of the head. Shift the labels by one (labels + 1) "
            f"and give the head one more output{more}, keeping blank=0; or add the output last and pass "
            "nn.CTCLoss(blank=C - 1), C the new number of outputs.")
