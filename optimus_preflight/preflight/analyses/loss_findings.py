"""What the criterion calls the loss spy recorded reveal (pure functions): the wrong kind
of values fed to a criterion (O12, O13, O16), targets that cannot be right (O14), an
initial loss far from chance (O1), and the ratio of the returned loss to the criterion's
value (a sum, or a division by the accumulation steps)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from optimus_preflight.preflight.analyses.loss_spy import (
    BINARY_CRITERIA,
    CLASS_CRITERIA,
    CriterionCall,
)
from optimus_preflight.preflight.analyses.output_range import OUTSIDE_SHARE


@dataclass
class Finding:
    code: str
    severity: str  # error | warning | info
    message: str
    fix: str
    code_fix: str | None = None


# A ReLU on the output layer: logits never negative and many exactly 0, which a linear
# head's output never is. Non-negative logits alone prove nothing: a head on pooled ReLU
# features can start with every class positive (mixup's CNN in blind set c does).
MIN_LOGITS_SEEN = 64
RELU_ZERO_SHARE = 0.05


def _clipped_logits(call: CriterionCall) -> Finding | None:
    """O12: logits for a criterion that applies its own softmax/sigmoid, cut at 0 by a
    ReLU on the output layer."""
    stats = call.input
    if call.function not in ("cross_entropy", "binary_cross_entropy_with_logits") or stats.min is None:
        return None
    if stats.min != 0 or stats.zero_fraction < RELU_ZERO_SHARE or math.prod(stats.shape) < MIN_LOGITS_SEEN:
        return None
    if stats.max == 0 and call.logit_activation not in ("Relu", "Threshold", "Hardtanh"):
        return None  # every logit 0: a zero-initialised head (NFNet, ViT, ReZero) starts there on purpose
    return Finding(
        "O12", "warning",
        f"{call.function} receives logits that are never negative (in [0, {stats.max:.3g}]) and "
        f"{stats.zero_fraction:.0%} exactly 0: a ReLU sits on the output layer. A class can only be pushed down "
        "to 0, not below, and the outputs at 0 get no gradient, so the model learns slowly or stops learning",
        "Remove the activation after the last linear layer: the criterion takes raw logits (any real value).",
    )


def loss_input_findings(calls: list[CriterionCall], activations: dict[str, int]) -> list[Finding]:
    """O12, O13, O16: the wrong kind of values fed to a criterion."""
    found: list[Finding] = []
    for call in calls:
        stats = call.input
        if stats is None or not stats.finite or stats.wrong_dims:
            continue  # normalised over the wrong dim: loss_shapes.norm_dim_findings explains it
        before = len(found)
        if call.function == "cross_entropy" and stats.probability_rows:
            found.append(Finding(
                "O12", "error",
                f"cross_entropy receives probabilities (non-negative rows summing to 1 over {call.n_classes} "
                "classes): a softmax is applied before a loss that applies its own, so gradients are diluted "
                "and the model learns slowly or not at all",
                "Feed raw logits to CrossEntropyLoss: remove the nn.Softmax/F.softmax from the model's head "
                "(apply softmax only at inference).",
            ))
        elif call.function == "cross_entropy" and stats.log_probability_rows:
            found.append(Finding(
                "O12", "info",
                "cross_entropy receives log-probabilities (log_softmax output); harmless, since log_softmax "
                "of log-probabilities changes nothing, but the extra log_softmax is wasted work",
                "Feed raw logits to CrossEntropyLoss, or keep log_softmax and use NLLLoss.",
            ))
        elif call.function == "nll_loss" and not stats.log_probability_rows:
            kind = "probabilities (softmax output)" if stats.probability_rows else "raw logits (values above 0)"
            found.append(Finding(
                "O16", "error",
                f"nll_loss receives {kind}, not log-probabilities: NLLLoss just picks -input[target], so the "
                "loss is meaningless",
                ("Apply F.log_softmax(logits, dim=1) before NLLLoss, or drop it and use CrossEntropyLoss on the "
                 "raw logits.") if len(stats.shape) < 3 else
                (f"Apply F.log_softmax over the class dimension (the one of size {call.n_classes}: dim=-1 of "
                 "(B, T, C) logits, before moving the classes to dim 1 for NLLLoss), or drop it and use "
                 "CrossEntropyLoss on the raw logits."),
            ))
        elif call.function == "binary_cross_entropy" and call.competing is not None and call.competing[0]:
            positives = call.competing[1]
            labels = call.input.shape[-1]
            found.append(Finding(
                "LOSS_SOFTMAX_BCE", "error" if positives > 1 else "warning",
                f"binary_cross_entropy receives rows that sum to 1 over their {labels} labels: a softmax makes "
                "the labels compete, while BCE scores each as its own yes/no"
                + (f", and target rows hold up to {positives:g} positive labels, which can then never all be "
                   "predicted (at most 1/k each)" if positives > 1 else
                   "; with one label per sample this is multi-class classification done the hard way"),
                ("Use torch.sigmoid per label instead of softmax, or better drop it and use BCEWithLogitsLoss on "
                 "the raw logits (multi-label)." if positives > 1 else
                 "Use CrossEntropyLoss on the raw logits with class-index targets (one label per sample), or "
                 "sigmoid + BCE if samples may have several labels."),
            ))
        elif call.function == "binary_cross_entropy" and activations.get("sigmoid", 0):
            found.append(Finding(
                "O13", "info",
                "sigmoid followed by binary_cross_entropy (BCELoss): BCELoss clamps its log at -100, so a sample "
                "whose sigmoid saturates (a logit past about +-17 in float32) gets a gradient of exactly 0 there, "
                "even when it is wrong. It trains as usual otherwise",
                "Remove the sigmoid from the model and use BCEWithLogitsLoss on the raw logits "
                "(pos_weight= for imbalanced labels).",
            ))
        elif (
            call.function == "binary_cross_entropy_with_logits"
            and activations.get("sigmoid", 0)
            and stats.min is not None
            and stats.min >= 0
            and stats.max <= 1
        ):
            found.append(Finding(
                "O13", "warning",
                "binary_cross_entropy_with_logits receives values in [0, 1] after a sigmoid: the sigmoid is "
                "applied twice, squashing every prediction towards 0.5-0.73",
                "Remove the sigmoid before BCEWithLogitsLoss; it applies its own.",
            ))
        if len(found) == before and (clipped := _clipped_logits(call)) is not None:
            found.append(clipped)
    return found


def target_findings(calls: list[CriterionCall]) -> list[Finding]:
    """O14: targets out of range or of the wrong dtype/shape for the criterion."""
    found: list[Finding] = []
    for call in calls:
        target, inputs = call.target, call.input
        if target is None or inputs is None or target.min is None:
            continue
        if call.function in CLASS_CRITERIA:
            if target.is_floating:
                if target.shape != inputs.shape:
                    found.append(Finding(
                        "O14", "error",
                        f"{call.function} gets floating-point targets of shape {target.shape} for input "
                        f"{inputs.shape}: class-index targets must be integers (long), probability targets "
                        "must have the input's shape",
                        "Convert class labels with targets.long() (shape (N,)); for soft labels pass an (N, C) "
                        "distribution.",
                    ))
                continue
            if target.dtype not in ("int64", "uint8"):
                found.append(Finding(
                    "O14", "error",
                    f"{call.function} gets {target.dtype} targets; it needs int64 (long) class indices",
                    "Return targets as torch.long from the dataset or collate_fn (targets.long()).",
                ))
            if target.min < 0 or target.max >= call.n_classes:
                found.append(Finding(
                    "O14", "error",
                    f"{call.function} targets span [{target.min:g}, {target.max:g}] but the input has "
                    f"{call.n_classes} classes, so valid targets are 0..{call.n_classes - 1}"
                    + (f" (or ignore_index={call.ignore_index})" if call.ignore_index is not None else "")
                    + "; on a GPU this is an opaque device-side assert",
                    "Remap labels to 0..C-1 (subtract 1 if they are 1-indexed), give the model's head as many "
                    "outputs as there are classes, and mark padding with ignore_index.",
                ))
        elif call.function in BINARY_CRITERIA:
            if not target.is_floating:
                found.append(Finding(
                    "O14", "error",
                    f"{call.function} gets {target.dtype} targets; it needs floating-point targets",
                    "Pass targets.float() to the binary loss.",
                ))
            elif target.min < 0 or target.max > 1:
                found.append(Finding(
                    "O14", "error",
                    f"{call.function} gets targets outside [0, 1]: they span [{target.min:g}, {target.max:g}], "
                    "while a binary loss reads each as the probability of the positive class. Above 1 the loss has "
                    "no minimum (it keeps falling as the logit grows), so raw scores, ratings or counts used as "
                    "targets push every output up instead of teaching the classes",
                    "Binary targets are 0/1 labels or probabilities: binarise them (y = (rating >= 4).float()) or "
                    "rescale them into [0, 1] ((y - y_min) / (y_max - y_min)); for ordered grades with more than two "
                    "values, use cross_entropy over the grades or a regression loss.",
                ))
    return found


# Regression targets this large while the model's predictions are this many times smaller:
# a fresh model's outputs are O(1), and whatever the optimizer, the head must grow by the
# targets' scale before the loss says anything but "predict the mean": Adam moves a weight
# by ~lr per step, so a 1e4 scale at lr=1e-3 takes millions of steps; SGD's gradient grows
# with the scale instead and diverges. Standardised or log targets start at the right scale.
TARGET_SCALE = 100.0
TARGET_SCALE_RATIO = 100.0
SCALE_CRITERIA = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss")


def regression_scale_findings(calls: list[CriterionCall]) -> list[Finding]:
    """TARGET_SCALE: regression targets orders of magnitude larger than the predictions."""
    for call in calls:
        target, inputs = call.target, call.input
        if (call.function not in SCALE_CRITERIA or target is None or inputs is None or target.min is None
                or inputs.min is None or not (target.is_floating and target.finite and inputs.finite)):
            continue
        target_scale = max(abs(target.min), abs(target.max))
        prediction_scale = max(abs(inputs.min), abs(inputs.max))
        if target_scale >= TARGET_SCALE and target_scale >= TARGET_SCALE_RATIO * max(prediction_scale, 1e-12):
            others = [other for other in calls if other is not call and other.loss is not None
                      and other.function != call.function and abs(other.loss) > 0]
            dominated = (f" In the sum, the {call.function} term ({call.loss:.3g}) dominates the {others[0].function} "
                         f"term ({others[0].loss:.3g}) by {math.log10(call.loss / abs(others[0].loss)):.0f} orders of "
                         "magnitude, so the other task's gradient is swamped and its head barely trains"
                         if others and call.loss is not None and call.loss >= TARGET_SCALE_RATIO * abs(others[0].loss)
                         else "")
            spread = (f" (mean {target.mean:.4g}, std {target.std:.3g})" if target.mean is not None
                      and target.std is not None else "")
            return [Finding(
                "TARGET_SCALE", "warning",
                f"{call.function} gets targets in [{target.min:.4g}, {target.max:.4g}]{spread}, raw values in their own "
                f"units (prices in dollars, counts, durations) never scaled, but predictions within "
                f"±{prediction_scale:.3g}, {target_scale / max(prediction_scale, 1e-12):.0f}x too small: the model must first "
                "grow its outputs that much before it learns anything beyond the mean, which takes Adam a learning rate's worth per step "
                f"(millions of steps at this scale) and makes SGD's gradients blow up.{dominated}",
                "Standardise the regression targets with the training set's statistics "
                "((y - y_mean) / y_std, or log1p(y) for prices and counts) and invert that on the predictions; "
                "or let the model's last layer start at the target scale (initialise its bias to y_mean).",
            )]
    return []


HALF_MANTISSA = {"bfloat16": 7, "float16": 10}  # explicit mantissa bits: relative spacing 2 ** -bits
RESOLVED = 4.0  # target spreads under this many spacings of the prediction's dtype are not resolved


def output_precision_findings(calls: list[CriterionCall]) -> list[Finding]:
    """OUTPUT_PRECISION_COARSE: regression predictions in bfloat16/float16 around a large offset,
    where the dtype's spacing is about as large as the targets' whole spread."""
    for call in calls:
        target, inputs = call.target, call.input
        if (call.function not in SCALE_CRITERIA or target is None or inputs is None or inputs.dtype not in HALF_MANTISSA
                or target.mean is None or target.std is None or not target.std or not target.is_floating):
            continue
        level = abs(target.mean)
        if level <= 0:
            continue
        spacing = 2.0 ** (math.floor(math.log2(level)) - HALF_MANTISSA[inputs.dtype])
        if target.std >= RESOLVED * spacing:
            continue
        return [Finding(
            "OUTPUT_PRECISION_COARSE", "warning",
            f"{call.function}'s predictions arrive in {inputs.dtype} (mixed precision) around {level:.4g}, the "
            f"targets' mean, where {inputs.dtype} values are {spacing:g} apart, while the targets vary by a std of only "
            f"{target.std:.3g}: every prediction is rounded to a step as large as the whole signal, so the model "
            "cannot resolve what it should learn (its outputs look the same for every sample)",
            "Standardise the target ((y - mean) / std, predictions inverted after) so the head works near 0, or run "
            "the output layer in float32 (precision='fp32', or the head outside autocast: "
            "torch.autocast(device_type, enabled=False) and .float() on its input).",
        )]
    return []


TRUNCATED_DISTINCT = 7  # whole-number targets with at most this many values ...
TRUNCATED_ZEROS = 0.3  # ... this share of them 0, and negatives among them


def truncated_target_findings(calls: list[CriterionCall]) -> list[Finding]:
    """TARGET_TRUNCATED: regression targets that went through an integer cast. Standardised
    values cast with .long() become a few whole numbers around a crowd of zeros, negatives
    included; counts and star ratings, whole numbers on purpose, are never negative."""
    for call in calls:
        target = call.target
        if (call.function not in SCALE_CRITERIA or target is None or not target.is_floating or not target.whole
                or target.distinct is None or target.min is None):
            continue
        if target.distinct <= TRUNCATED_DISTINCT and target.min < 0 and target.zero_fraction >= TRUNCATED_ZEROS:
            return [Finding(
                "TARGET_TRUNCATED", "warning",
                f"{call.function}'s targets are whole numbers ({target.distinct} distinct values in "
                f"[{target.min:g}, {target.max:g}], {target.zero_fraction:.0%} of them 0) though they are negative "
                "too: continuous regression targets cast to an integer type (.long(), int(), astype(int)) lose "
                "everything after the decimal point and most of them truncate to 0",
                "Keep regression targets floating point: torch.tensor(y, dtype=torch.float32) in the Dataset, "
                "not .long() (a class dataset's cast).",
            )]
    return []


def output_range_findings(calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_OUTPUT_RANGE: regression predictions from a bounded activation, targets outside it."""
    found: list[Finding] = []
    for call in calls:
        bounded = call.output_range
        if bounded is None or bounded.outside < OUTSIDE_SHARE:
            continue
        high = "inf" if bounded.high == float("inf") else f"{bounded.high:g}"
        target = call.target
        spread = f" (targets in [{target.min:.4g}, {target.max:.4g}])" if target is not None and target.min is not None else ""
        # a non-negative output against targets below 0: standardised (z-scored) targets, half of them negative
        negative = (" They are negative targets below a non-negative output: its outputs can never go below 0, while "
                    "standardised (z-scored, zero-mean) targets are negative about half the time"
                    if bounded.low == 0 and target is not None and target.min is not None and target.min < 0 else "")
        # (x, y) points or 4-number boxes above 1 under a sigmoid: coordinates normalised by the size
        # of an image that was resized while its boxes kept the original resolution
        coordinates = (bounded.activation == "sigmoid" and target is not None and target.min is not None
                       and target.min >= 0 and 1 < target.max <= 8 and call.target_shape is not None
                       and len(call.target_shape) >= 2 and call.target_shape[-1] in (2, 4))
        resized = (f" The targets are coordinates ({call.target_shape[-1]} per row) up to {target.max:.2g} times the "
                   "image size: boxes or keypoints kept in the original image's pixels while the image was resized "
                   "(or divided by the resized size), so every target sits scaled away from its object"
                   if coordinates else "")
        found.append(Finding(
            "LOSS_OUTPUT_RANGE", "error",
            f"{call.function}'s predictions come out of a {bounded.activation}, so they stay in [{bounded.low:g}, {high}], "
            f"but {bounded.outside:.0%} of the targets lie outside that range{spread}: the model can never reach them, "
            f"and the loss has a floor no training goes below.{negative}{resized}",
            "Map the targets into [-1, 1] before the loss (STS gold scores of 0 to 5: scores / 5, as "
            "sentence-transformers' CosineSimilarityLoss expects; or 2 * (s - min) / (max - min) - 1), or predict "
            "the score with a linear head on the pair's embeddings." if bounded.activation == "cosine similarity" else
            f"Scale the tanh to the targets' range ({_bound(target)} * torch.tanh(h) for targets within "
            f"+-{_bound(target)}: an action bound), or map the targets into [-1, 1] (targets / bound) and back at "
            "inference." if bounded.activation == "tanh" and target is not None and target.min is not None else
            "Resize the boxes with the image: multiply the coordinates by new_size / old_size in the same transform "
            "(or normalise them by the size of the image they were measured on)." if coordinates else
            f"Remove the {bounded.activation} after the last layer (a regression head is linear), or map the targets "
            f"into [{bounded.low:g}, {high}] (and back at inference): e.g. min-max scale them for a sigmoid.",
        ))
    return found


def _bound(target: object) -> str:
    """The targets' largest magnitude, rounded up to a readable bound."""
    largest = max(abs(target.min), abs(target.max))  # type: ignore[attr-defined]
    return f"{math.ceil(largest * 10) / 10:g}"


EXPLODING_INIT_LOSS = 3.0  # x ln(C), + 1: a warning above, a note between 1.5x + 0.5 and this
HUGE_LOGIT = 1e3  # |logit| at init: only a scale applied to the logits (or exploding layers) gets there


def init_loss_finding(calls: list[CriterionCall]) -> tuple[Finding | None, dict[str, Any]]:
    """O1 "verify the loss at init": with hard targets, a fresh classifier scores ~ln(C)."""
    call = next((c for c in calls if c.function in CLASS_CRITERIA and c.hard_targets and c.loss is not None
                 and c.reduction != "sum"), None)  # a sum is not comparable with ln(C)
    if call is None or not call.n_classes or call.n_classes < 2 or not math.isfinite(call.loss):
        return None, {"applicable": False}
    expected = math.log(call.n_classes)
    data = {"applicable": True, "loss": round(call.loss, 4), "ln_classes": round(expected, 4), "classes": call.n_classes}
    if call.loss > 1.5 * expected + 0.5:
        # Moderately high is what a pretrained backbone's large features give a fresh head
        # (a linear probe starts at 2-3x ln C): a note. Far above is activations that blow
        # up through the layers, or targets that do not match the outputs: a warning.
        exploding = call.loss > EXPLODING_INIT_LOSS * expected + 1
        largest = max(abs(call.input.min or 0.0), abs(call.input.max or 0.0))
        if exploding and largest >= HUGE_LOGIT:
            return Finding(
                "O1", "warning",
                f"initial loss {call.loss:.4g} is far above ln({call.n_classes}) = {expected:.3f}, the loss of uniform "
                f"predictions, and the logits reach {largest:.3g}: the softmax is saturated, so the loss is driven "
                "by the single hardest wrong class and its gradient by one logit. Logits this large come from a "
                "scale somewhere on the way: inputs that were never normalised (raw pixels, a power spectrogram "
                "without a log, features in the thousands: see data.input_scale); a sum that grows with its size "
                "(a graph layer summing over neighbours with an unnormalised adjacency, a sum pooling); or a "
                "temperature or logit scale used the wrong way (CLIP's logit_scale initialised to 1/0.07 = 14.3 "
                "itself and then .exp()'d multiplies by e^14.3 = 1.6e6; a division by a temperature meant as a "
                "multiplication)",
                "Find where the scale enters: normalise the inputs (standardise features, log a spectrogram, scale "
                "pixels to [0, 1]); normalise sums (mean pooling, D^-1/2 (A + I) D^-1/2 for a graph's adjacency); "
                "store a learnable logit scale as a log and exponentiate it: logit_scale = nn.Parameter("
                "torch.tensor(math.log(1 / 0.07))), logits = logit_scale.exp() * sim (clamped, e.g. at 100).",
            ), data
        return Finding(
            "O1", "warning" if exploding else "info",
            f"initial loss {call.loss:.3f} is far above ln({call.n_classes}) = {expected:.3f}, the loss of "
            "uniform predictions: the model starts confidently wrong, which wastes the first steps"
            + (" and can destabilise training" if exploding else
               " (normal for a fresh head on a pretrained backbone's features)"),
            "Initialise the output layer small (e.g. std=0.02, zero bias), check the inputs are normalised, "
            "and check the targets line up with the inputs.",
        ), data
    return None, data


# ------------------------------------------------------------ O9 double division
_SAME = 1e-3  # relative: two ways of summing the same float32 values agree far closer


def close(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= _SAME * max(abs(a), abs(b), 1e-12)


MEAN_REDUCTIONS = ("mean", "batchmean")


def criterion_ratio(calls: list[CriterionCall], returned: float | None) -> float | None:
    """returned / the criterion's value when compute_loss returns a constant multiple of
    one mean criterion (or of the sum of all of them), else None. Several candidates:
    the ratio to the one that is a clean 1/k, else to the single criterion."""
    means = [c.loss for c in calls if c.reduction in MEAN_REDUCTIONS and c.loss is not None and c.error is None]
    if returned is None or not means or not math.isfinite(returned):
        return None
    candidates = [*means, sum(means)] if len(means) > 1 else means
    ratios = [returned / value for value in candidates if math.isfinite(value) and abs(value) > 1e-12]
    for ratio in ratios:
        if ratio > 0 and close(1 / ratio, round(1 / ratio)) and round(1 / ratio) > 1:
            return ratio
    return ratios[0] if len(means) == 1 and ratios else None


# Activations whose output range bounds the logits a class criterion gets: (low, high).
BOUNDED_LOGITS = {"Sigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0), "Hardsigmoid": (0.0, 1.0), "Hardtanh": (-1.0, 1.0)}


def bounded_logit_findings(calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_BOUNDED_LOGITS: cross_entropy on logits that come out of a sigmoid or tanh. The
    largest margin between two classes is the range's width, so the loss has a floor of
    log(1 + (C - 1) * exp(-width)) however well the model ranks the classes."""
    for call in calls:
        bounds = BOUNDED_LOGITS.get(call.logit_activation or "")
        if call.function != "cross_entropy" or bounds is None or not call.n_classes or call.n_classes < 2:
            continue
        width = bounds[1] - bounds[0]
        floor = math.log(1 + (call.n_classes - 1) * math.exp(-width))
        return [Finding(
            "LOSS_BOUNDED_LOGITS", "error",
            f"cross_entropy receives logits that come out of a {call.logit_activation.lower()}, bounded to "
            f"[{bounds[0]:g}, {bounds[1]:g}]: the largest margin between two of its {call.n_classes} classes is "
            f"{width:g}, so the loss can never fall below {floor:.3f} (ln C = {math.log(call.n_classes):.3f}) and "
            "the gradients shrink as the activation saturates",
            f"Remove the {call.logit_activation.lower()} after the output layer: cross_entropy takes raw, "
            "unbounded logits and applies log_softmax itself.",
        )]
    return []


def pooled_class_findings(calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_POOLED_OVER_CLASSES: a class criterion whose input is a (B, T, C) head's output reduced
    over its last dim, the head's C outputs: the classes are pooled away and what is left, one
    value per frame, is scored against per-class targets. Silent only where T == C."""
    for call in calls:
        if call.pooled_features is None:
            continue
        reduction = call.pooled_features
        return [Finding(
            "LOSS_POOLED_OVER_CLASSES", "warning",
            f"{call.function} receives the model's per-frame output reduced with {reduction}(dim=-1): the last dim "
            "holds the output layer's features, the classes, so the classes are pooled away and each of the "
            "remaining values is a time step (a frame), not a class. With as many frames as classes the shapes "
            "still match the (B, C) clip targets, and every 'class' column is trained on another frame",
            f"Pool over time, the frames' axis: clip_logits = frame_logits.{reduction}(dim=1) for (B, T, C) frame "
            "logits (or attention pooling over dim 1), so the clip keeps one value per class.",
        )]
    return []


def class_dim_findings(calls: list[CriterionCall]) -> list[Finding]:
    """LOSS_CLASS_DIM: a (B, T, C) input straight from a linear layer, whose outputs are on the
    last dim, given to a criterion that reads the classes from dim 1. With T == C nothing
    raises: the positions are scored as classes and the classes as positions."""
    for call in calls:
        if not call.classes_last or call.input is None:
            continue
        shape = call.input.shape
        silent = " Nothing raises because the two sizes are equal" if shape[1] == shape[-1] else ""
        return [Finding(
            "LOSS_CLASS_DIM", "error",
            f"{call.function} reads the classes from dim 1 of its {shape} input, but that tensor comes straight from "
            f"a linear layer, whose {shape[-1]} outputs are on the last dim: dim 1 holds the positions, so the loss "
            f"scores each position as a class and each class as a position.{silent}",
            f"Flatten the positions into the batch: {call.function}(logits.reshape(-1, logits.size(-1)), "
            "targets.reshape(-1)), or move the classes to dim 1: logits.permute(0, 2, 1) (logits.transpose(1, 2)).",
        )]
    return []
