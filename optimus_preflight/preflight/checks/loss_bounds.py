"""A loss with no lower bound (``step.loss_bounds``).

``LOSS_UNBOUNDED_BELOW``: a loss the model can drive to minus infinity by moving all its
predictions one way. A pinball (quantile) loss given its quantile in percent, q=90 for
P90 (``max(q * e, (q - 1) * e)`` is then negative for every over-prediction and falls
without limit), a sign flipped in a hand-written loss, a log-likelihood whose variance the
model controls without a floor. Training then "improves" forever by running the outputs
off to infinity: the loss curve looks like learning.

Measured with the model in eval mode: ``compute_loss`` runs with the model's floating
outputs shifted by a constant (10 and 1000 times their spread, both signs). A bounded loss
grows or flattens; one that goes negative and keeps falling as fast as the shift grows (ten
times more between the two shifts than before the first) has no minimum. Each of a few
outputs is also shifted alone (a VAE's KL term with the wrong sign falls in its mean and
log-variance while the reconstruction grows), and each learned parameter of a few values is
moved the same way (Kendall's task weighting written ``exp(log_var) * L + log_var``).
Normalised (log-)probabilities are not shifted: no model output can leave their simplex.

``LOSS_SHRINKS_EACH_CALL``: the same batch, seed and eval mode give a loss that falls by
over 1% at each of four calls: the loss function keeps state, such as a normaliser that is
a running total never reset (``self.tokens += n; loss / self.tokens``), so its gradients
shrink like 1/step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.eval_forward import eval_forward, loss_value, loss_with_output, model_outputs
from optimus_preflight.preflight.analyses.loss_shapes import log_sums_to_zero, sums_to_one
from optimus_preflight.preflight.analyses.output_descent import class_labels, descend_on_outputs, rewards_mistakes
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves, map_batch, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

SHIFTS = (10.0, 1000.0)  # in units of the outputs' spread
FALL = 10.0  # from the small to the large shift the loss falls this many times more than before it
MAX_OUTPUTS = 4  # outputs shifted one at a time as well (and as many small parameters)
SMALL_PARAMETER = 8  # values: a learned scalar or a few (log-variances, a temperature), shifted by SHIFTS
REPEATS = 3  # more calls on the same batch, each expected to give the same loss
SHRINK = 0.01  # a loss that falls by more than this share at every repeated call keeps state


def _shiftable(value: Any) -> bool:
    # Predictions only: a 0-dim tensor is a loss the model computed itself (a Hugging Face
    # output's .loss); normalised (log-)probabilities cannot be moved by training off their simplex.
    if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 1 and value.numel() > 1):
        return False
    if value.dim() >= 2 and value.shape[-1] >= 2:
        rows = value.detach().float()
        if log_sums_to_zero(rows, -1) or (bool((rows >= 0).all()) and sums_to_one(rows, -1)):
            return False
    return True


def shifted_loss(ctx: PreflightContext, batch: Any, shift: float, only: int | None = None) -> float | None:
    """The scalar loss with the model's floating outputs (or only output number ``only``)
    moved by ``shift`` times their spread; -inf when it falls that far, None when not a number."""

    def move(module: torch.nn.Module, args: Any, output: Any) -> Any:
        count = [-1]

        def one(value: Any) -> Any:
            if not _shiftable(value):
                return value
            count[0] += 1
            if only is not None and count[0] != only:
                return value
            spread = float(value.detach().float().std())
            return value + shift * (spread if spread > 0 else 1.0)
        return map_batch(one, output)

    handle = ctx.model.register_forward_hook(move) if shift else None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # a loss that samples (negatives, noise) samples the same each call
            output = eval_forward(ctx, batch)
    finally:
        if handle is not None:
            handle.remove()
    value = loss_value(output)
    return None if value is None or math.isnan(value) or value == math.inf else value


def _tried(ctx: PreflightContext, batch: Any, shift: float, only: int | None) -> float | None:
    try:
        return shifted_loss(ctx, batch, shift, only)
    except Exception:
        return None


def _layer_parameter(model: torch.nn.Module, name: str) -> bool:
    """Whether the parameter belongs to one of torch's layers (a Linear's bias): an output bias
    drives the loss to 0 on a batch of one class, which no weighting of the loss does."""
    owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    return type(owner).__module__.startswith("torch.nn.")


VANISHED = 1e-3  # of the loss at the parameter's value: what is left of it after the first shift


def _vanishes(base: float, near: float | None, far: float | None) -> bool:
    """A positive loss that a learned parameter scales towards 0: a thousandth of it left after
    the first shift, no more after the second."""
    return base > 0 and near is not None and far is not None and 0 <= far <= near <= VANISHED * base


def _unbounded(base: float, near: float | None, far: float | None) -> bool:
    """The loss goes negative and keeps falling as fast as the shift grows (or reaches -inf)."""
    if near is None or far is None:
        return False
    if far == -math.inf:
        return True
    return far < 0 and far < near and near - far >= FALL * max(base - near, 0.0, 1e-6 * abs(base))


LINEAR = (50.0, 200.0)  # (base - far) / (base - near) of a term linear in the output: SHIFTS' ratio, 100


def _log_determinant(base: float, near: float | None, far: float | None, only: int | None,
                     shapes: list[tuple[int, ...]]) -> bool:
    """A normalising flow's log-determinant: one value per sample, returned beside the
    transformed samples, entering the negative log-likelihood linearly. Alone it lowers the
    loss without limit, yet the model cannot move it without moving the samples, whose
    term grows faster (shifting every output together found no fall)."""
    if only is None or near is None or far is None or not math.isfinite(far) or len(shapes) < 2:
        return False
    rows = shapes[only][0]
    if math.prod(shapes[only]) != rows or not any(math.prod(shape) > rows for shape in shapes):
        return False
    drop = base - near
    return drop > 0 and LINEAR[0] <= (base - far) / drop <= LINEAR[1]



# A normalising flow's log-scales: with the log-determinant's sign flipped, shrinking them lowers the loss forever.
FLOW_LOG_DET = (". In a normalising flow, a log-determinant subtracted where it is added does this through the "
                "scales: the NLL -(log p(z) - log|det J|) rewards contracting every sample onto z = 0, since "
                "log|det J| (the sum of the log-scales) then falls without bound")
FLOW_LOG_DET_FIX = (" For a flow, add the log-determinant (change of variables): nll = -(base.log_prob(z).sum(-1) + "
                    "log_det).mean().")


MIN_ROWS = 4  # of the output, to compare the exact target with another row's
DISTANCE_MARGIN = 0.1  # of the larger loss: the exact target's loss above another row's by this much
NEARBY = 0.1  # of the field's std: the exact target nudged by noise this large costs clearly less


MAX_GRADES = 10


def relevance_grades(values: torch.Tensor) -> bool:
    """Whole numbers of at most ten levels, not all equal: graded relevance per item (pure)."""
    if values.is_floating_point() and not bool((values == values.round()).all()):
        return False
    levels = int(values.unique().numel())
    return 2 <= levels <= MAX_GRADES and float(values.min()) >= 0


def scale_like(name: str) -> bool:
    """A parameter named as a scale or log-scale (a flow's ``log_scale``, an ActNorm's ``logs``)."""
    leaf = name.rsplit(".", 1)[-1].lower()
    return "scale" in leaf or leaf in ("logs", "log_s", "s")

class LossBoundsCheck(Check):
    """LOSS_UNBOUNDED_BELOW: shifting the predictions drives the loss to minus infinity."""

    name = "step.loss_bounds"
    stage = Stage.STEP
    codes = ("LOSS_UNBOUNDED_BELOW", "LOSS_WEIGHT_VANISHES", "LOSS_SHRINKS_EACH_CALL", "LOSS_REWARDS_MISTAKES")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        try:
            base = shifted_loss(ctx, batch, 0.0)
            if base is None or not math.isfinite(base):
                findings.data["summary"] = "no scalar loss"
                return
            # How many outputs can be shifted (a VAE's reconstruction, mean, log-variance).
            answers = model_outputs(ctx, batch) or []  # one eval forward, read by the rules below too
            shapes = [tuple(value.shape) for value in answers if _shiftable(value)]
            outputs = len(shapes)
            # All outputs together, then each alone when there are a few (a VAE's mean and log-variance).
            targets = [None] + (list(range(outputs)) if 1 < outputs <= MAX_OUTPUTS else [])
        except Exception:
            findings.data["summary"] = "the loss could not be computed on shifted outputs"
            return
        # A shift one output cannot take (a sigmoid's probabilities pushed past 1 into
        # binary_cross_entropy) says nothing about the others: each is tried on its own.
        found = {(only, sign * shift): _tried(ctx, batch, sign * shift, only)
                 for only in targets for shift in SHIFTS for sign in (1, -1)}
        findings.data.update(loss=base, shifted={f"{only}:{shift:g}": value for (only, shift), value in found.items()})
        findings.data["summary"] = (f"loss {base:.4g}; at the largest shifts {found[None, SHIFTS[-1]]}, "
                                    f"{found[None, -SHIFTS[-1]]}")
        for only in targets:
            for sign in (1, -1):
                near, far = found.get((only, sign * SHIFTS[0])), found.get((only, sign * SHIFTS[-1]))
                if _unbounded(base, near, far) and not _log_determinant(base, near, far, only, shapes):
                    self._report(findings, base, near, far, "up" if sign > 0 else "down", only, outputs)
                    return
        if self._small_parameters(ctx, batch, base, findings):
            return
        if self._rewards_mistakes(ctx, batch, findings):
            return
        if self._rewards_distance(ctx, batch, answers, base, findings):
            return
        if self._ranks_backwards(ctx, batch, answers, findings):
            return
        self._repeated(ctx, batch, base, findings)

    @staticmethod
    def _rewards_distance(ctx: PreflightContext, batch: Any, outputs: list[torch.Tensor], base: float,
                          findings: Findings) -> bool:
        """A model with one output tensor scored against a batch tensor of its shape: the loss with
        the output replaced by that tensor exactly, against the same tensor one row off (each sample
        given another's target). A loss over rows is lower for the exact target; one that is higher
        rewards distance from it (a similarity returned without its minus)."""
        if not outputs or len(outputs) != 1 or not outputs[0].is_floating_point() or outputs[0].dim() < 2 \
                or outputs[0].shape[0] < MIN_ROWS:
            return False
        shape = outputs[0].shape
        rewarded = []  # (gap, field, exact, another row's) of each field whose exact values cost more
        for index, given in enumerate(leaves(batch)):
            if not (isinstance(given, torch.Tensor) and given.is_floating_point() and given.shape == shape):
                continue
            noise = torch.randn(given.shape, generator=torch.Generator().manual_seed(0)).to(given.device)
            nearby = given + NEARBY * float(given.float().std()) * noise.to(given.dtype)
            try:  # a loss that differentiates its outputs (a PINN's residual) cannot take a batch tensor
                exact = loss_with_output(ctx, batch, lambda output, t=given: t.to(output.dtype))
                other = loss_with_output(ctx, batch, lambda output, t=given: t.roll(1, 0).to(output.dtype))
                near = loss_with_output(ctx, batch, lambda output, t=nearby: t.to(output.dtype))
            except Exception:
                continue
            if exact is None or other is None or near is None:
                continue
            margin = DISTANCE_MARGIN * max(abs(exact), abs(other), 1e-6)
            # A loss that rewards distance peaks at the exact target: a convex loss (MSE, cross-entropy
            # on logits) has no maximum, so values that only resemble the target (an input image, x0
            # beside a v-prediction target) cost more as given yet less once nudged they never do.
            if exact > base and exact > other + margin and near < exact - margin:
                rewarded.append((exact - other, index, exact, other))
        # the target itself is the most extreme: a noisy input beside it only resembles it
        for _, index, exact, other in sorted(rewarded, reverse=True)[:1]:
            findings.data["exact_target"] = {"field": index, "exact": exact, "another_row": other, "model": base}
            findings.error(
                "LOSS_REWARDS_MISTAKES",
                f"the loss is highest for a perfect prediction: with the model's {tuple(shape)} output replaced by "
                f"batch field {index} exactly (the tensor it is scored against) it is {exact:.4g}, against {other:.4g} "
                f"with each sample given another sample's values and {base:.4g} for the model's own output. Training "
                "lowers the loss by moving the outputs away from their targets. A similarity returned as the loss "
                "without its minus sign does this: SI-SNR / SNR / PSNR, a Dice or IoU score, a cosine similarity or "
                "a log-likelihood",
                "Return the negative of a similarity (loss = -si_snr(estimate, target).mean(), 1 - dice, 1 - cosine), "
                "so the loss is lowest when the output equals its target.",
            )
            return True
        return False

    @staticmethod
    def _ranks_backwards(ctx: PreflightContext, batch: Any, outputs: list[torch.Tensor], findings: Findings) -> bool:
        """Per-item scores (B, L) beside (B, L) relevance grades (whole numbers, a few levels): the loss
        with the scores set to the grades, against the grades negated. A ranking loss is lower for the
        order the grades give; one lower for the reversed order ranks the worst items first."""
        if not outputs or len(outputs) != 1 or not outputs[0].is_floating_point():
            return False
        shape = outputs[0].shape
        for index, grades in enumerate(leaves(batch)):
            if not (isinstance(grades, torch.Tensor) and grades.dim() == 2 and grades.shape[1] >= 2
                    and grades.numel() == outputs[0].numel() and tuple(shape[:2]) == tuple(grades.shape)
                    and relevance_grades(grades)):
                continue
            as_scores = grades.float()
            try:
                ranked = loss_with_output(ctx, batch, lambda output, t=as_scores: t.reshape(output.shape).to(output.dtype))
                reversed_ = loss_with_output(ctx, batch, lambda output, t=as_scores: (-t).reshape(output.shape).to(output.dtype))
            except Exception:
                continue
            if ranked is None or reversed_ is None or ranked <= reversed_ + DISTANCE_MARGIN * max(abs(ranked), abs(reversed_), 1e-6):
                continue
            findings.data["grade_order"] = {"field": index, "scores_as_grades": ranked, "reversed": reversed_}
            findings.error(
                "LOSS_REWARDS_MISTAKES",
                f"the loss ranks the worst items first: with the model's scores set to the relevance grades of batch "
                f"field {index} ({tuple(grades.shape)}, the best items highest) it is {ranked:.4g}, and with the "
                f"order reversed {reversed_:.4g}. Training will put the least relevant items on top. A pairwise "
                "loss whose score difference runs the other way from its label does this (RankNet's s_j - s_i "
                "scored against the label g_i > g_j), as do relevance targets built from rank positions (1 = best) "
                "where larger must mean better",
                "Orient each pair one way: logit = s_i - s_j with label (g_i > g_j) (or MarginRankingLoss(s_i, s_j, "
                "sign(g_i - g_j))); give listwise targets as gains where higher is better (e.g. max_rank - rank).",
            )
            return True
        return False

    @staticmethod
    def _rewards_mistakes(ctx: PreflightContext, batch: Any, findings: Findings) -> bool:
        found = descend_on_outputs(ctx, batch)
        labels = class_labels(batch)
        if found is None or labels is None:
            return False
        findings.data["descent"] = {"loss": [round(found.loss_before, 4), round(found.loss_after, 4)],
                                    "label_probability": [round(found.true_probability_before, 4),
                                                          round(found.true_probability_after, 6)],
                                    "accuracy": [found.accuracy_before, found.accuracy_after]}
        classes = int(labels.max()) + 1
        if not rewards_mistakes(found, max(classes, 2)):
            return False
        findings.error(
            "LOSS_REWARDS_MISTAKES",
            f"the loss is lowest for wrong predictions: descending on the model's class scores themselves lowers it "
            f"from {found.loss_before:.4g} to {found.loss_after:.4g} while the labels' mean probability falls from "
            f"{found.true_probability_before:.3g} to {found.true_probability_after:.2g} and the argmax gets "
            f"{found.accuracy_after:.0%} of the batch right. Training will make the loss fall and the model wrong. "
            "Usually a hand-written loss is missing the minus sign: a focal loss written (1 - p_t) ** gamma * "
            "log(p_t) where FL = -(1 - p_t) ** gamma * log(p_t), a log-likelihood returned instead of its negative, "
            "or a score subtracted the other way",
            "Negate the log-likelihood term: loss = -((1 - p_t) ** gamma * log_p_t).mean() (p_t = log_p_t.exp(), "
            "log_p_t = F.log_softmax(logits, -1).gather(1, y[:, None]).squeeze(1)); a loss must be lowest when the "
            "true class is predicted.",
        )
        return True

    @staticmethod
    def _small_parameters(ctx: PreflightContext, batch: Any, base: float, findings: Findings) -> bool:
        """A learned scalar of the loss (a task's log-variance, a temperature) that lowers it without bound."""
        small = [(name, p) for name, p in ctx.model.named_parameters()
                 if p.requires_grad and p.is_floating_point() and p.numel() <= SMALL_PARAMETER][:MAX_OUTPUTS]
        for name, param in small:
            found = {}
            for shift in SHIFTS:
                for sign in (1, -1):
                    saved = param.detach().clone()
                    try:
                        with torch.no_grad():
                            param.add_(sign * shift)
                        found[sign * shift] = shifted_loss(ctx, batch, 0.0)
                    except Exception:
                        found[sign * shift] = None
                    finally:
                        with torch.no_grad():
                            param.copy_(saved)
            for sign in (1, -1):
                near, far = found[sign * SHIFTS[0]], found[sign * SHIFTS[-1]]
                direction = "up" if sign > 0 else "down"
                if _vanishes(base, near, far) and not _layer_parameter(ctx.model, name):
                    findings.error(
                        "LOSS_WEIGHT_VANISHES",
                        f"the loss vanishes through the learned parameter '{name}' ({param.numel()} value(s)): moving "
                        f"it {direction} by {SHIFTS[0]:g} and {SHIFTS[-1]:g} takes the loss from {base:.4g} to "
                        f"{near:.3g} and then {far:.3g}, so the optimizer can lower it to 0 by scaling every term "
                        "away instead of fitting the tasks: the weights fall towards 0 and the tasks stop learning. A "
                        "learned task weighting (Kendall's uncertainty weights) written exp(-log_var) * loss without "
                        "its + log_var term does this",
                        "Add the term that pays for a small weight: torch.exp(-log_var) * task_loss + log_var (per "
                        "task, summed); or fix the weights instead of learning them.",
                    )
                    return True
                if not _unbounded(base, near, far):
                    continue
                findings.error(
                    "LOSS_UNBOUNDED_BELOW",
                    f"the loss has no lower bound in the learned parameter '{name}' ({param.numel()} value(s)): "
                    f"moving it {direction} by {SHIFTS[0]:g} and {SHIFTS[-1]:g} takes the loss from {base:.4g} to "
                    f"{near:.4g} and then {far:.4g}, so the optimizer can lower it forever through that parameter "
                    "alone while the rest stops learning. A learned task weighting (Kendall's uncertainty weights) "
                    "written exp(log_var) * loss + log_var, where exp(-log_var) * loss + log_var is meant, does this: "
                    "its task weights exp(log_var) fall to 0; so does a temperature or scale without a floor"
                    + (FLOW_LOG_DET if scale_like(name) else ""),
                    "Write the uncertainty weighting as torch.exp(-log_var) * task_loss + log_var (the precision "
                    "multiplies the loss; log_var pays for it), or bound the parameter (clamp, softplus + floor)."
                    + (FLOW_LOG_DET_FIX if scale_like(name) else ""),
                )
                return True
        return False

    @staticmethod
    def _repeated(ctx: PreflightContext, batch: Any, base: float, findings: Findings) -> None:
        """The same batch, the same seed, eval mode: a loss that keeps falling from call to call keeps state."""
        try:
            values = [base] + [shifted_loss(ctx, batch, 0.0) for _ in range(REPEATS)]
        except Exception:
            return
        if any(v is None or not math.isfinite(v) for v in values) or base <= 0:
            return
        if not all(later < earlier * (1 - SHRINK) for earlier, later in zip(values, values[1:])):
            return
        shown = " -> ".join(f"{v:.4g}" for v in values)
        findings.warning(
            "LOSS_SHRINKS_EACH_CALL",
            f"the loss function returns a smaller value for the same batch at every call (eval mode, same seed: "
            f"{shown}): it keeps state across calls that shrinks the loss, such as a normaliser accumulated as a "
            "running total that is never reset (self.tokens += mask.sum(); return loss_sum / self.tokens). The "
            "divisor grows with every step, so the loss and its gradients shrink like 1/step: a learning rate that "
            "decays by itself, and training stalls",
            "Divide by this batch's own count (tokens = mask.sum(); return loss_sum / tokens), or reset the "
            "running total every step.",
        )

    @staticmethod
    def _report(findings: Findings, base: float, near: float, far: float, direction: str, only: int | None,
                outputs: int) -> None:
        which = "every prediction" if only is None else f"output {only} of the model's {outputs} alone"
        cause = ("A pinball (quantile) loss given its quantile in percent (q=90 for P90: max(q * e, (q - 1) * e) is "
                 "negative and unbounded for every over-prediction), or a sign flipped in a hand-written loss, does this")
        if only is not None:
            cause = ("One output of several lowers it alone: a regulariser added with the wrong sign, e.g. a VAE's KL "
                     "term written + 0.5 * sum(1 + logvar - mu^2 - exp(logvar)) (that is minus the KL; the ELBO loss "
                     "adds -0.5 * sum(...)), or a log-variance, scale or temperature output without a floor. " + cause)
        findings.error(
            "LOSS_UNBOUNDED_BELOW",
            f"the loss has no lower bound: moving {which} {direction} (eval mode) takes it from {base:.4g} to "
            f"{near:.4g} and then {far:.4g}, so training can lower it forever by running the outputs off to "
            f"infinity. {cause}",
            "Check the sign of each loss term (a KL divergence is >= 0 and is added: kl = -0.5 * sum(1 + logvar - "
            "mu^2 - exp(logvar))); give a quantile as a fraction in (0, 1) (q=0.9 for P90): a loss must have a "
            "minimum the model can reach (0 for a perfect prediction in a pinball or squared loss).",
        )
