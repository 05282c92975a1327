"""Checks that read the observed first step (``probe.py``): the loss, the gradients,
the train/eval modes it ran in and left, what reaches the criterion, the targets,
padding the criterion trains on, and the loss at initialisation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.api_pitfalls import pitfall_findings
from optimus_preflight.preflight.analyses.criterion_args import criterion_arg_findings
from optimus_preflight.preflight.analyses.custom_functions import none_gradients
from optimus_preflight.preflight.analyses.device_errors import device_error_fix
from optimus_preflight.preflight.analyses.gradient_reversal import Reversal
from optimus_preflight.preflight.analyses.graph_cuts import GraphCut, cut_explaining
from optimus_preflight.preflight.analyses.loss_findings import (
    bounded_logit_findings,
    class_dim_findings,
    init_loss_finding,
    loss_input_findings,
    output_precision_findings,
    output_range_findings,
    pooled_class_findings,
    regression_scale_findings,
    target_findings,
    truncated_target_findings,
)
from optimus_preflight.preflight.analyses.loss_shapes import (
    broadcast_findings,
    column_broadcast_findings,
    kl_norm_dim_findings,
    norm_dim_findings,
    shape_error_fix,
)
from optimus_preflight.preflight.analyses.loss_spy import SIGN_MODULES
from optimus_preflight.preflight.analyses.loss_terms import MixedReductions
from optimus_preflight.preflight.analyses.padded_loss import padded_loss_findings
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.analyses.target_profile import (
    all_ignored,
    all_ignored_message,
    collapsed_target_finding,
    made_target_finding,
    one_class_candidate,
    one_class_finding,
    profile_findings,
)
from optimus_preflight.preflight.analyses.unread_outputs import unread_output
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.target_classes import (
    few_classes_candidate,
    few_classes_enough,
    few_classes_message,
    label_leaf,
    per_sample_label_leaf,
    scan_classes,
    scan_labels,
)
from optimus_preflight.preflight.framework import Check, Findings, PreflightBug, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.analyses.loss_spy import CriterionCall
    from optimus_preflight.preflight.analyses.probe import StepProbe
    from optimus_preflight.preflight.framework.context import PreflightContext

FIRST_STEP = "step.first_step"


def _names(items: list[str], limit: int = 6) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


DETACHED_SLOPE = 0.2  # d(returned loss) / d(criterion) below this ...
DETACHED_VALUE = 0.5  # ... while the returned value is at least this share of the criterion's


def _why_no_gradient(missing: list[str], modules_run: set[str], hooks_detaching: list[str] | None = None,
                     without_grad: set[str] | None = None, cuts: list[GraphCut] | None = None,
                     recurrent: set[str] | None = None, trained: set[str] | None = None,
                     hugging_face: bool = True) -> tuple[str, str]:
    """What the modules owning gradient-less parameters did in the step's forward: ran (their
    output was dropped before the loss, or a forward hook replaced it with a detached copy) or
    never ran (defined, not called)."""
    if hooks_detaching:
        return (f"A forward hook on {_names(hooks_detaching, 3)} returns a tensor cut from the graph: a forward hook's "
                "return value REPLACES the module's output, so a hook that records activations and ends with "
                "`return activations[name]` (its stored detached copy) cuts the graph there, and every layer before it "
                "gets no gradient",
                "End hooks that only record without a return value (store output.detach() and return None); return a "
                "tensor only to change the output on purpose.")
    owners = sorted({name.rpartition(".")[0] for name in missing})
    ran = [owner for owner in owners if owner in modules_run]
    if ran and (cut := cut_explaining(cuts or [], missing)) is not None:
        cut_owners = sorted({name.rpartition(".")[0] for name in cut.params & set(missing)})
        if cut.call.startswith("comparison"):
            operator = cut.call.partition(" ")[2]
            return (f"The step compares a {cut.shape} tensor computed from {_names(cut_owners, 4)} with {operator} "
                    f"(a hard threshold such as (s {operator} 0).float() for binary codes, hash bits or a gate): a "
                    "comparison returns booleans, which carry no gradient, so backward stops there and every layer "
                    "before it gets no gradient",
                    f"Pass the gradient past the threshold with a straight-through estimator: b = s + ((s {operator} 0)"
                    ".float() - s).detach() (forward: the hard bits; backward: the identity), or train on a soft "
                    "version (torch.sigmoid(s / temperature), torch.tanh(s)) and threshold only at inference.")
        through = ".detach().numpy()" if cut.numpy and cut.call == ".detach()" else cut.call
        return (f"The step calls {through} on a {cut.shape} tensor computed from {_names(cut_owners, 4)}"
                + (" and hands it to NumPy" if cut.numpy else "")
                + ": that leaves autograd, and whatever is computed from the result is a new tensor with no graph, "
                "so backward stops there and every layer before it gets no gradient. A NumPy round trip in forward "
                "(np.clip(h.detach().numpy(), ...) with the .detach() added because .numpy() refused a tensor that "
                "requires grad) or a .data / .item() on the way does this",
                "Keep the computation in torch so the graph is kept: torch.clamp(h, lo, hi) for np.clip, torch.where "
                "for np.where, torch ops for each NumPy call in forward; keep .detach() only where gradients must "
                "stop on purpose.")
    no_grad = [owner for owner in ran if owner in (without_grad or set())]
    if no_grad and len(no_grad) == len(ran):
        return (f"{_names(no_grad, 4)} ran in the forward with gradients switched off: the model's forward calls them "
                "inside torch.no_grad() (or torch.inference_mode()), so autograd records nothing for them and they "
                "never train, though they are in the optimizer and requires_grad=True",
                "Remove the `with torch.no_grad():` around these layers in forward (keep it only around parts meant "
                "to stay frozen, and set requires_grad=False on those); evaluation code belongs in the eval loop, "
                "not in forward.")
    if not ran:
        return ("Their modules were never called in the forward: defined but not used (a branch never taken, a layer "
                "left out of forward, or a wrapper such as a LoRA adapter assigned to an attribute the forward never "
                "reads, while an nn.Sequential keeps calling the original layer)",
                "If they are unused on purpose, set requires_grad=False or remove them; else call them in forward.")
    layers = sorted({".".join(parts[:index + 1]) for parts in (owner.split(".") for owner in ran)
                     for index in [next((i for i, part in enumerate(parts) if part.isdigit()), None)]
                     if index is not None})
    stacks = sorted({layer.rpartition(".")[0] for layer in layers})
    if layers and trained is not None and not hugging_face and all(
            stack and not any(name.startswith(stack + ".") for name in trained) for stack in stacks):
        # Every layer of the stack is cut off, not the last few: the stack's own output is dropped.
        return (f"Their layers ran in the forward ({_names(layers, 4)}: all of {_names(stacks, 3)}), but none of "
                "their output reaches the loss: what follows reads another tensor where the stack's output was "
                "meant. A head reading an earlier state (states[0], the stack's input, for states[-1]), the wrong "
                "variable (a two-tower score q @ q.T, the query tower against itself, where q @ k.T with the item "
                "tower's output was meant; a result assigned to a name nothing reads), or an out-of-place op whose "
                "result is dropped (pooled.index_add(0, batch, h) or h.add(pos) on a line of its own, where "
                "index_add_ / h = h + pos was meant) does this",
                "Use the stack's output: read its last state (states[-1], hidden_states[-1]), check that each line "
                "reads the variable just computed, and assign or use the in-place form of out-of-place ops "
                "(x = x.index_add(...), or x.index_add_(...)).")
    if layers:
        return (f"Their layers ran in the forward ({_names(layers, 4)}), but their output never reaches the loss, so "
                "these encoder layers never contribute: the head reads an earlier layer's output. In a Hugging Face "
                "model hidden_states[0] is the embedding layer's output, not the last layer's",
                "Read the last layer: outputs.last_hidden_state or outputs.hidden_states[-1] (not hidden_states[0]); "
                "if the layers are unused on purpose, drop them or set requires_grad=False.")
    dropped_rnn = [owner for owner in ran if owner in (recurrent or set())]
    trained_rnn = [name for name in (recurrent or set()) if name not in owners and name in modules_run]
    if dropped_rnn and trained_rnn:
        return (f"The recurrent encoder {_names(dropped_rnn, 2)} ran in the forward, but neither its outputs nor its "
                f"final hidden state reach the loss, while the recurrent decoder {_names(trained_rnn, 2)} trains: the "
                "encoder's final hidden state is never passed to the decoder, which called without an initial state "
                "(decoder(x) instead of decoder(x, h_n)) starts from zeros, so nothing of the source reaches the "
                "output",
                "Pass the encoder's final state as the decoder's initial state: _, h = self.encoder(src); out, _ = "
                "self.decoder(tgt_in, h) (for an LSTM the (h_n, c_n) tuple); with a bidirectional encoder, combine "
                "its two directions to the decoder's size first.")
    return (f"{_names(ran, 3)} ran in the forward, but its output never reaches the loss: the result was computed "
            "and discarded on the way. Usually an out-of-place op whose return value is dropped (h.add(pos) or "
            "h.mul(mask) on a line of its own, where h = h + pos or h.add_(pos) was meant), an output assigned to a "
            "name that is not used after, or a .detach()",
            "Use the result: h = h + self.pos(positions) (or the in-place h.add_(...)); check the variable the "
            "next line reads is the one just computed.")


def _unread_output_cause(position: int, count: int, read: list[int]) -> tuple[str, str]:
    reads = f"it reads element {', '.join(str(i) for i in read)} instead" if read else "it reads none of them"
    return (f"Their result is returned by the model (element {position} of the {count} tensors its forward returns), "
            f"but the loss never reads that element: {reads}. Picking the wrong element of a tuple output (out[0] "
            "for the forecast of an N-BEATS (backcast, forecast) pair, a multi-task model's other head, the hidden "
            "state for the output) does this: the head meant never trains while another is fitted to its targets",
            f"Read the output meant: e.g. backcast, forecast = model(x); loss = criterion(forecast, y) (element "
            f"{position}); unpack the tuple by name rather than by index.")


class FirstStepCheck(Check):
    """O3: one real step on the first batch; the loss is a finite scalar attached to the graph."""

    name = FIRST_STEP
    stage = Stage.STEP
    codes = ("LOSS_NONFINITE", "O3", "O5", "O24", "STEP_ERROR", "TARGET_ALL_IGNORED", "LOSS_FN_SIDE_EFFECT",
             "LOSS_RESEEDS_RNG", "LOSS_MOSTLY_DETACHED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        if probe.preflight_fault:  # a fake tensor of the memory estimate reached the real step: not the user's error
            raise PreflightBug(
                f"the first training step failed on a fake tensor left by the preflight's memory estimate "
                f"({probe.error.splitlines()[0]}): a bug of the preflight, not of your code",
                probe.error_traceback,
            )
        if "weights_zeroed" in probe.loss_side_effects:
            findings.error(
                "LOSS_FN_SIDE_EFFECT",
                "the forward writes zeros into the model's own weights: values of a parameter that were not 0 before "
                "compute_loss are exactly 0 after it, with no optimizer step in between. An in-place mask on the "
                "weight itself (self.emb.weight.data.mul_(mask) as 'embedding dropout', a pruning mask applied with "
                "weight.data *= mask in forward) wipes what those rows learned at every training step, so they never "
                "accumulate anything",
                "Mask a copy for this step only: F.embedding(ids, self.emb.weight * mask) (the gradient then flows "
                "through the mask), or torch.nn.utils.prune to keep a mask beside the weight; never write into "
                "weight.data in forward.",
            )
        elif "weights_quantised" in probe.loss_side_effects:
            findings.error(
                "LOSS_FN_SIDE_EFFECT",
                "the forward overwrites the model's weights with quantised values: parameters that held continuous "
                "values before compute_loss hold a few evenly spaced levels after it, with no optimizer step in "
                "between (weight.data = fake_quant(weight) in a quantisation-aware layer). Every optimizer update "
                "smaller than half a quantisation step is rounded away at the next forward, so the weights never "
                "leave their grid and training barely moves",
                "Keep float (shadow) weights and quantise a copy in the forward with a straight-through estimator: "
                "w_q = w + (fake_quant(w) - w).detach(); out = F.linear(x, w_q, bias); never write into weight.data.",
            )
        elif "weights_toward_frozen" in probe.loss_side_effects or "weights_beside_frozen_copy" in probe.loss_side_effects:
            seen = ("moves the trained weights part of the way towards a frozen copy of the same shape (new = m * "
                    "trained + (1 - m) * frozen)" if "weights_toward_frozen" in probe.loss_side_effects else
                    "writes the trained weights, while the model holds a frozen copy of them (parameters of the same "
                    "shapes, requires_grad=False: a momentum encoder or an EMA teacher)")
            findings.error(
                "LOSS_FN_SIDE_EFFECT",
                f"the loss function {seen}: a momentum (EMA) update, or a soft (Polyak) update of a target network, "
                "written backwards (param_q = m * param_q + (1 - m) * param_k, soft_update(online, target, tau) with "
                "its arguments swapped), where the frozen key encoder, teacher or target network should follow the "
                "trained one. The trained network is dragged back towards the stale copy at every step and the "
                "frozen copy never learns anything (or, if no such update runs in the forward, an optimizer.step() inside the loss "
                "applies every batch twice)",
                "Update the frozen copy from the trained one, without gradients: with torch.no_grad(): for q, k in "
                "zip(encoder_q.parameters(), encoder_k.parameters()): k.mul_(m).add_(q, alpha=1 - m); leave "
                "optimizer.step() to the loop.",
            )
        elif probe.loss_side_effects:
            what = {"lr": "changes the learning rate (a scheduler.step() inside it)",
                    "weights": "changes the weights (an optimizer.step() inside it)"}
            findings.error(
                "LOSS_FN_SIDE_EFFECT",
                "the loss function " + " and ".join(what[e] for e in probe.loss_side_effects) + ": the training loop "
                "already steps the optimizer and the scheduler once per optimizer step, so every batch is applied "
                "twice (the second time with stale gradients) or the schedule runs several times faster than "
                "planned, and gradient accumulation breaks",
                "Only compute and return the loss in compute_loss / loss_fn; leave optimizer.step(), zero_grad() and "
                "scheduler.step() to the loop (pass the scheduler to run_preflight / the recipe instead).",
            )
        share = probe.loss_gradient_share
        if share is not None and 0 < abs(share[0]) < DETACHED_SLOPE and share[1] > DETACHED_VALUE:
            slope, value = share
            findings.error(
                "LOSS_MOSTLY_DETACHED",
                f"the returned loss has {value:.2g}x the value of its criterion's loss but only {slope:.2g}x its "
                "gradient: most of it is a detached number carried from earlier steps, a running (exponentially "
                "smoothed) loss kept for the progress bar and returned in place of the batch's loss "
                "(0.98 * previous.detach() + 0.02 * loss), so every update is that many times smaller than intended",
                "Return the batch's loss itself; keep the smoothed value for logging only (smoothed = 0.98 * "
                "smoothed + 0.02 * loss.item()).",
            )
        if probe.loss_reseeds:
            findings.warning(
                "LOSS_RESEEDS_RNG",
                f"the loss function seeds the global random generator on every call ({probe.loss_reseeds[0]}): "
                "everything random drawn after it (negative samples, noise, masks, dropout) is the same at every "
                "step, so a model trained on 'random' negatives only ever sees the same few, and the rest of the run's "
                "randomness restarts from that seed each step",
                "Seed once, at the start of the run; for reproducible draws inside the loss use a private generator "
                "created once (g = torch.Generator().manual_seed(0) in __init__, then torch.randint(..., generator=g)).",
            )
        loss = probe.loss
        findings.data.update(
            loss=loss.value if loss else None,
            grad_norm=probe.grad_norm,
            stepped=probe.stepped,
            step_s=round(probe.step_s, 4),
        )
        if probe.completed:
            findings.data["summary"] = f"loss {loss.value:.4f}, grad norm {probe.grad_norm:.3g}, {probe.step_s:.2f} s"
        if loss is not None and loss.kind != "tensor":
            findings.error("O3", f"compute_loss returned a {loss.kind}, not a loss tensor",
                           "Return the loss tensor itself (not loss.item() or a float), optionally as (loss, count).")
        elif loss is not None and loss.shape is not None and len(loss.shape) > 0 and loss.shape != (1,):
            findings.error("O3", f"compute_loss returned a loss of shape {loss.shape}, not a scalar",
                           "Reduce the loss to a scalar (reduction='mean'), optionally returning (loss, count).")
        elif loss is not None and not loss.requires_grad:
            findings.error(
                "O3",
                "the loss is detached from the graph (requires_grad=False): backward() cannot reach the parameters "
                "and the model will not learn",
                "Do not call .detach(), .item(), .numpy() or torch.tensor(...) on the path to the loss, and do not "
                "compute it under torch.no_grad().",
            )
        elif probe.error is not None:
            where = f" at {probe.error_frame}" if probe.error_frame else ""
            findings.data["traceback"] = probe.error_traceback
            findings.error("STEP_ERROR", f"the first training step raised {probe.error.splitlines()[0]}{where}",
                           shape_error_fix(probe.criterion_calls)
                           or device_error_fix(probe.error, ctx.device, probe.error_frame)
                           or (f"Fix the error at {probe.error_frame}, the last frame of your code it passed through; "
                               "the full traceback is in the report: the data['traceback'] of step.first_step (preflight.json)."
                               if probe.error_frame else
                               "Fix the error; call compute_loss (or your loss function) on one batch by hand to "
                               "see its full traceback."))
        elif _nan_from_ignored_targets(probe) is not None:
            # 0/0 over no targets: the labels, not the inputs or the learning rate
            findings.error("TARGET_ALL_IGNORED", *all_ignored_message(_nan_from_ignored_targets(probe), nan=True))
        elif loss is not None and not loss.finite:
            findings.error(
                "LOSS_NONFINITE",
                f"the loss on the first batch is {loss.value}",
                "Check the inputs for NaN/inf, the loss for log(0) or division by zero, and the learning-rate warmup.",
            )
        if probe.forward_in_eval:
            findings.warning(
                "O5",
                "the training forward ran with the model in eval mode: something between model.train() and the "
                "forward (compute_loss?) calls model.eval(), so dropout is off and BatchNorm uses running statistics",
                "Do not call model.eval() in compute_loss; evaluate in a separate pass that restores train mode.",
            )
        elif probe.modules_in_eval:
            findings.warning(
                "O5",
                f"{len(probe.modules_in_eval)} dropout/BatchNorm module(s) ran in eval mode during the training "
                f"forward: {_names(probe.modules_in_eval)}",
                "Do not switch trainable submodules to eval() inside the model or compute_loss.",
            )
        elif probe.modules_left_in_eval:
            findings.warning(
                "O5",
                f"the training step leaves {len(probe.modules_left_in_eval)} dropout/BatchNorm module(s) in eval mode "
                f"({_names(probe.modules_left_in_eval)}): compute_loss or a forward hook calls .eval() after the "
                "training forward and never switches back. The training loop calls model.train() once, before the "
                "first step, so every later step trains with dropout off and BatchNorm frozen to its running "
                "statistics",
                "Restore the mode right after the pass that needs eval mode: was_training = model.training; "
                "model.eval(); ...; model.train(was_training).",
                code_fix="In your compute_loss, call model.train(was_training) after the pass that needs eval mode "
                         "(or run that pass on a separate copy of the model).",
            )
        if probe.scaler_enabled and probe.completed and not probe.stepped:
            findings.info("O24", "the GradScaler skipped the first step (inf/NaN at the initial scale); normal while "
                                 "it calibrates, a problem if it keeps happening")


def _nan_from_ignored_targets(probe: StepProbe) -> CriterionCall | None:
    """The criterion call whose every target is ignore_index, when the step ran and its
    loss is non-finite: ``step.first_step`` names that cause instead of a NaN diagnosis."""
    loss = probe.loss
    if probe.error is not None or loss is None or loss.kind != "tensor" or loss.finite or not loss.requires_grad:
        return None
    return next((call for call in probe.criterion_calls if all_ignored(call)), None)


def _reversal_findings(reversals: list[Reversal], findings: Findings) -> None:
    """GRADIENT_REVERSED_ON_LABELS: a gradient reversal between the model and the criterion
    on the batch's labels (in front of the label head, not the adversary's)."""
    found = next((r for r in reversals if r.on_labels), None)
    if found is None:
        return
    adversary = ("; the other loss term of the step reaches the model without one, so the reversal is in front "
                 "of the wrong head" if found.others_unreversed else "")
    findings.warning(
        "GRADIENT_REVERSED_ON_LABELS",
        f"{found.function} (a custom autograd Function whose backward returns {found.factor:g} x the gradient: a "
        f"gradient reversal) sits between the model and {found.criterion} on the batch's labels: the layers below "
        f"it are trained to make the labels HARDER to predict, the opposite of the task{adversary}",
        "In domain-adversarial training the reversal goes in front of the domain (adversary) classifier only: "
        "label_head(h), domain_head(GradReverse.apply(h, alpha)).",
    )


def _task_cut_finding(criterion: str, pick: str, lost: list[str], findings: Findings) -> None:
    if pick in ("argmin()", "argmax()"):
        how = (f"{pick}, which has no gradient: the task term ({criterion}) never reaches them, and they train on "
               "the loss's other terms alone (a commitment or auxiliary term). A vector quantiser that passes "
               "codebook[argmin] on without the straight-through estimator does this: the encoder never learns "
               "what the task needs")
        fix = ("Pass the task's gradient past the choice with the straight-through estimator: z = z_e + (z_q - z_e)"
               ".detach() (forward: the code; backward: the identity to z_e), or a soft choice (softmax, Gumbel-"
               "softmax with hard=True).")
    else:
        how = (f"a random draw, {pick}, which passes no gradient to the distribution's parameters"
               + (" (sample() draws under torch.no_grad())" if pick == "Distribution.sample()" else
                  " (its backward is zero)")
               + f": the task term ({criterion}) never reaches them, and they train on the loss's other terms alone. "
               "A VAE that samples its latent this way trains its encoder on the KL term only, so the posterior "
               "matches the prior and the decoder sees noise")
        fix = ("Draw with the reparameterisation trick, which keeps the draw differentiable in its parameters: "
               "dist.rsample() instead of dist.sample(), or z = mu + std * torch.randn_like(std) instead of "
               "torch.normal(mu, std) (a relaxed distribution such as RelaxedBernoulli for discrete draws).")
    findings.warning(
        "TASK_LOSS_CUT",
        f"{len(lost)} trainable parameter(s) ({_names(lost)}) feed the model's output only through {how}",
        fix,
    )


def hf_pooler_prefixes(model: torch.nn.Module) -> tuple[str, ...]:
    """Parameter-name prefixes of the ``pooler`` of each Hugging Face model inside ``model``."""
    return tuple(f"{name}.pooler.".lstrip(".") for name, module in model.named_modules()
                 if type(module).__module__.startswith("transformers.")
                 and isinstance(getattr(module, "pooler", None), torch.nn.Module))


LOW_NOISE_SHARE = 0.25  # of x_t's variance from the noise, at the noisiest timestep of the batch


class GradientsCheck(Check):
    """Every trainable parameter gets a finite gradient from the first step."""

    name = "step.gradients"
    stage = Stage.STEP
    codes = ("GRAD_NONE", "GRAD_NONFINITE", "GRAD_ZERO", "SAMPLE_WITHOUT_GRADIENT", "LOSS_NOT_FROM_OUTPUT", "GRADIENT_REVERSED_ON_LABELS",
             "TASK_LOSS_CUT")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        _reversal_findings(probe.gradient_reversals, findings)
        missing, nonfinite = probe.params_without_grad, probe.params_nonfinite_grad
        findings.data.update(trainable=probe.trainable_params, without_grad=len(missing), nonfinite=len(nonfinite))
        findings.data["summary"] = f"{probe.trainable_params - len(missing)}/{probe.trainable_params} trainable tensors got a gradient"
        distributed = ctx.training.dist.world_size > 1
        unused_poolers = [name for name in missing if name.startswith(hf_pooler_prefixes(ctx.model))]
        if unused_poolers and not distributed and len(missing) < probe.trainable_params:
            # BertModel and its kin compute pooler_output on every call; a head on last_hidden_state
            # (the [CLS] row, a mean) leaves it unused, which costs nothing outside DDP.
            findings.data["unused_pooler"] = unused_poolers
            missing = [name for name in missing if name not in unused_poolers]
        loss_is_leaf = probe.loss is not None and probe.loss.requires_grad and probe.loss.leaf
        if missing and len(missing) == probe.trainable_params and loss_is_leaf:
            findings.error(
                "GRAD_NONE",
                "no trainable parameter received a gradient: the loss compute_loss returns is itself a new leaf "
                "tensor with no grad_fn, cut from the model's graph, so backward stops at once and nothing will train. "
                "torch.tensor(value, requires_grad=True) around a value computed outside autograd (NumPy, .item(), "
                ".detach()) builds such a leaf: requires_grad=True does not connect it to the model",
                "Compute the loss with torch operations on the model's output, keeping it a tensor all the way "
                "(torch.maximum(q * e, (q - 1) * e).mean(), not np.maximum(...) on pred.detach().numpy()).",
            )
        elif missing and len(missing) == probe.trainable_params and probe.outside_leaves:
            shapes = ", ".join(str(tuple(leaf.shape)) for leaf in probe.outside_leaves[:3])
            findings.error(
                "GRAD_NONE",
                f"no trainable parameter received a gradient: the loss's graph starts at {len(probe.outside_leaves)} "
                f"new leaf tensor(s) of shape {shapes} made in compute_loss, not at the model's output, so backward "
                "stops there and nothing will train. torch.tensor([...], requires_grad=True) of .item() values (to log "
                "or sum several losses) builds such a leaf",
                "Combine the loss tensors themselves (loss = cls_loss + reg_loss, or torch.stack([...]).sum()); log "
                ".item() values separately, never rebuild the loss from them.",
            )
        elif missing and len(missing) == probe.trainable_params:
            findings.error("GRAD_NONE", "no trainable parameter received a gradient: nothing will train",
                           "Check that the loss is computed from the model's output (see step.first_step).")
        elif missing and (checkpointed := _reentrant_checkpoint(probe.step_warnings)):
            findings.error(
                "GRAD_NONE",
                f"{len(missing)} trainable parameter(s) got no gradient from the first step and will never train: "
                f"{_names(missing)}. torch.utils.checkpoint warned during the step ({checkpointed!r}): reentrant "
                "checkpointing (use_reentrant=True) of a block whose inputs do not require grad (raw images, token "
                "ids, a frozen stem's output) returns an output detached from the block's parameters",
                "Call torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) (the non-reentrant variant "
                "tracks the parameters whatever the inputs), or do not checkpoint the first block.",
            )
        elif missing and any(probe.derivative_calls) and all(name.endswith("bias") for name in missing):
            # A loss built from the model's derivatives (a Hamiltonian network's dH/dz, a PINN's u_x)
            # cannot see an additive constant of the output: the last layer's bias gets no gradient.
            findings.data["constant_under_derivative"] = missing
        elif missing:
            recurrent = {name for name, module in ctx.model.named_modules() if isinstance(module, torch.nn.RNNBase)}
            trained = {name for name, param in ctx.model.named_parameters() if param.requires_grad} - set(missing)
            hugging_face = any(type(module).__module__.startswith("transformers.") for module in ctx.model.modules())
            why, fix = _why_no_gradient(missing, probe.modules_run, probe.hooks_detaching, probe.modules_run_without_grad,
                                        probe.graph_cuts, recurrent, trained, hugging_face)
            if (unread := unread_output(ctx, missing)) is not None:
                why, fix = _unread_output_cause(*unread)
            silent = next((call for call in probe.custom_functions if none_gradients(call)), None)
            if silent is not None:
                # A Function's forward runs with grad off, which reads as a cut; its backward's None is the cause.
                name = silent.cls.__name__
                why = (f"{name}.backward (a custom autograd Function in the step) returns None for its input, so no "
                       "gradient passes through it to the layers before it; a backward whose `return grad_input` is "
                       "missing does this (step.custom_backward names it)")
                fix = f"End {name}.backward with `return grad_input` (one gradient per input of forward)."
            findings.add(
                "error" if distributed else "warning",
                "GRAD_NONE",
                f"{len(missing)} trainable parameter(s) got no gradient from the first step and will never train: "
                f"{_names(missing)}. {why}"
                + (". DDP will fail with 'Expected to have finished reduction'" if distributed else ""),
                fix + " Under DDP, find_unused_parameters=True tolerates unused parameters at a cost.",
            )
        if probe.task_cut is not None:
            _task_cut_finding(*probe.task_cut, findings)
        elif probe.task_cut_by_detach is not None:
            criterion, _, lost, trainer = probe.task_cut_by_detach
            findings.warning(
                "TASK_LOSS_CUT",
                f"{len(lost)} trainable parameter(s) ({_names(lost)}) reach the first loss term ({criterion}) only "
                f"through a .detach(): that term, the task, never trains them, and they learn from another term alone "
                f"({trainer}). A multi-task model whose main head reads the shared encoder through h.detach() (a "
                "'keep the auxiliary task from hurting the main one' snippet put on the wrong branch) does this: the "
                "main head becomes a linear probe on features built for the auxiliary task",
                "Remove the .detach() on the main task's branch; to keep an auxiliary or diagnostic head from shaping "
                "the encoder, detach the input of that head instead (aux_head(h.detach())).",
            )
        # A loss made of the output's derivatives (a PINN's residual from autograd.grad with create_graph)
        # reaches the parameters through the double-backward graph, not through the output's own node.
        if probe.loss_ignores_output and len(missing) < probe.trainable_params and not any(probe.derivative_calls):
            findings.error(
                "LOSS_NOT_FROM_OUTPUT",
                "the loss does not depend on the model's output: backward reaches the parameters only through "
                "another term (a weight penalty, an auxiliary loss), so the data term never trains them. The data "
                "term was turned into a number on the way: .item(), float(), .detach(), .numpy() or torch.tensor(...)",
                "Keep the data term a tensor: loss = ce + 5e-4 * l2, not ce.item() + 5e-4 * l2; log .item() values "
                "separately.",
            )
        zeroed = [name for name in probe.params_zero_grad if name not in missing]
        if (zeroed or probe.grad_norm == 0.0) and probe.singleton_softmax:
            shape, dim = probe.singleton_softmax[0]
            which = f"{len(zeroed)} trainable parameter(s) got a gradient of exactly 0 from the first step: " \
                f"{_names(zeroed)}" if zeroed and probe.grad_norm != 0.0 else \
                "every gradient of the first step is exactly zero"
            findings.error(
                "GRAD_ZERO",
                f"{which}. The loss's graph takes a softmax over dim {dim} of a {shape} tensor, a dimension of size "
                "1: softmax there is 1 (log_softmax 0) whatever its input, so its gradient is 0 and everything that "
                "computes its input never trains. Attention pooling does this with scores of shape (B, T, 1) "
                "normalised with dim=-1 instead of over the T positions, leaving an unweighted sum",
                "Normalise over the dimension that holds the alternatives: softmax(scores, dim=1) for (B, T, 1) "
                "attention scores (or squeeze the last dim first); for a single binary logit use sigmoid / "
                "BCEWithLogitsLoss instead of a softmax over one class.",
            )
        elif (zeroed or (probe.grad_norm == 0.0 and not missing)) and probe.zero_gradient_ops:
            ops = ", ".join(f"torch.{op.removesuffix('Backward0').removesuffix('Backward1').lower()}"
                            for op in probe.zero_gradient_ops)
            which = (f"{len(zeroed)} trainable parameter(s) got a gradient of exactly 0 from the first step: "
                     f"{_names(zeroed)}" if probe.grad_norm != 0.0 else "every gradient of the first step is exactly zero")
            findings.error(
                "GRAD_ZERO",
                f"{which}. The loss's graph passes through {ops}, whose gradient is 0 everywhere (a step function: "
                "rounding predictions inside the loss, or a threshold), so everything before it never trains",
                "Give the discrete step a gradient: a straight-through estimator (h + (torch.round(h) - h).detach()), "
                "or a soft relaxation (sigmoid with a temperature, F.gumbel_softmax) while training.",
            )
        if zeroed and probe.zero_factors and not probe.zero_gradient_ops and probe.grad_norm != 0.0:
            findings.error(
                "GRAD_ZERO",
                f"{len(zeroed)} trainable parameter(s) got a gradient of exactly 0 from the first step: {_names(zeroed)}. "
                f"The loss's graph multiplies a term by a constant 0 ({probe.zero_factors} time(s)): a loss weight of "
                "0.0, e.g. a weights dict read with .get(key, 0.0) under a key it does not have, so that term's head "
                "never trains; or, inside the model, a scale that came out 0, such as an adapter's scaling written "
                "with integer division (alpha // r is 0 whenever alpha < r; LoRA scales by alpha / r)",
                "Check the loss weights where the terms are summed (a misspelt key, a schedule that starts at 0 and "
                "never rises); read required weights with weights[key] so a missing key raises. Compute scales with "
                "true division (self.scaling = alpha / r).",
            )
        hooked = [name for name in zeroed if name in probe.hooked_params]
        if hooked and not probe.zero_gradient_ops and not probe.zero_factors and probe.grad_norm != 0.0:
            findings.error(
                "GRAD_ZERO",
                f"{len(hooked)} trainable parameter(s) got a gradient of exactly 0 from the first step: "
                f"{_names(hooked)}, and each has a gradient hook (Tensor.register_hook): the hook returns zeros. "
                "Usually a mask meant to freeze part of a tensor (the pretrained rows of an embedding) built the "
                "wrong way round: torch.zeros(...) with the frozen part set to 0 zeroes every row, so nothing of "
                "that tensor ever trains",
                "Build the mask from torch.ones(...) and set the frozen rows to 0 (mask[:n_frozen] = 0); check that "
                "mask.sum() counts the rows meant to train.",
            )
        if probe.sampling_ops:
            drawn = ", ".join(probe.sampling_ops)
            findings.warning(
                "SAMPLE_WITHOUT_GRADIENT",
                f"the loss's graph goes through {drawn} drawn from tensors that require grad: torch's gradient of a "
                "draw with respect to its parameters is zero, so nothing that computes them (a VAE encoder's mean "
                "and std) learns from the terms after the draw, only from terms on the parameters themselves (the "
                "KL). z = torch.normal(mu, std) in place of the reparameterisation trick does this",
                "Reparameterise the draw: z = mu + std * torch.randn_like(std) (or torch.distributions.Normal(mu, "
                "std).rsample()); for discrete draws use a relaxation (F.gumbel_softmax) or a score-function "
                "estimator.",
            )
        if nonfinite:
            findings.error("GRAD_NONFINITE", f"{len(nonfinite)} parameter(s) got inf/NaN gradients: {_names(nonfinite)}",
                           "Check the loss and inputs for inf/NaN; lower the learning rate or enable gradient clipping "
                           "(trainer.clip_grad_norm).", "trainer.clip_grad_norm")
        if probe.singleton_softmax:
            pass  # reported above
        elif probe.zero_gradient_ops:
            pass  # reported above
        elif probe.grad_norm == 0.0 and not missing and probe.clamp_ops:
            findings.error(
                "GRAD_ZERO",
                "every gradient of the first step is exactly zero, and the loss's graph passes through torch.clamp "
                f"({', '.join(op.removesuffix('Backward0').removesuffix('Backward1') for op in probe.clamp_ops)}): "
                "clamp passes no gradient outside its bounds, so a loss (or what it is computed from) clamped to a "
                "bound it already exceeds is a constant. A loss.clamp(max=...) 'against spikes' does this as soon as "
                "the loss is above the cap, e.g. from the first step of a classifier whose initial loss ln C exceeds it",
                "Remove the clamp from the loss; to guard against spikes clip the gradients instead "
                "(trainer.clip_grad_norm, torch.nn.utils.clip_grad_norm_) or skip non-finite steps.",
            )
        elif probe.grad_norm == 0.0 and not missing and probe.batch_rows == 1:
            findings.warning(
                "GRAD_ZERO",
                "every gradient of the first step is exactly zero, and the batch holds a single sample "
                "(batch_size=1): a loss that compares the samples of a batch with each other is exactly 0 for one "
                "sample. A Cox partial likelihood's risk set is then the subject itself (log_h - logcumsumexp(log_h) "
                "= 0), a ranking or pairwise loss has no pair, an in-batch contrastive loss no negative, and a term "
                "centred on the batch mean is 0",
                "Use batches of many samples for a loss over the batch (hundreds for a Cox partial likelihood, or the "
                "whole training set per step); accumulating gradients over batches of one does not help, since each "
                "one's loss is 0.",
                "data.batch_size",
            )
        elif probe.grad_norm == 0.0 and not missing:
            findings.warning("GRAD_ZERO", "every gradient of the first step is exactly zero",
                             "Check for a constant loss (e.g. all targets ignored) or dead activations.")


def _reentrant_checkpoint(messages: list[str]) -> str | None:
    """torch.utils.checkpoint's warning that a reentrant checkpoint's inputs need no gradient."""
    return next((message for message in messages if "requires_grad" in message and "checkpoint" in message.lower()
                 or "None of the inputs have requires_grad=True" in message), None)


class LossFunctionCheck(Check):
    """O12 softmax into CrossEntropyLoss, O16 NLLLoss without log_softmax, O13 sigmoid + BCELoss;
    a softmax over the wrong dim, and an elementwise loss that broadcasts its operands."""

    name = "step.loss_function"
    stage = Stage.STEP
    codes = ("O12", "O13", "O16", "TARGET_PEAK_BELOW_ONE", "LOSS_NORM_DIM", "LOSS_BROADCAST", "LOSS_ONE_PREDICTION", "LOSS_SOFTMAX_BCE", "LOSS_OUTPUT_RANGE",
             "LOSS_PAIR_SLICES", "LOSS_CLASS_WEIGHTS", "LOSS_BOUNDED_LOGITS", "LOSS_POOLED_OVER_CLASSES", "LOSS_CLASS_DIM", "CTC_BLANK_IN_TARGETS", "CTC_NOT_LOG_PROBS", "CTC_LENGTHS_TOO_SHORT", "MULTILABEL_MARGIN_MULTI_HOT",
             "POISSON_LOG_INPUT", "LOSS_INDEXED_BY_BATCH", "TRANSPOSE_1D", "MESHGRID_INDEXING", "BOX_CORNERS_UNORDERED", "KL_DIV_INPUT_NOT_LOG", "KL_TERM_CONSTANT", "SOFT_TARGET_CLASS_ORDER", "TARGETS_ON_TWO_SCALES", "PRUNING_KEEPS_SMALLEST", "PRUNING_MASK_OVER_INPUTS", "MASK_IS_PARAMETER", "BCE_WEIGHT_NOT_POS_WEIGHT", "CONTRASTIVE_LOGITS_ARE_DISTANCES", "NEGATIVE_IS_ANCHOR", "CONTRASTIVE_TARGET_NOT_POSITIVE", "TARGET_PARTS_ONE_LABEL", "DISTANCE_OVER_BATCH", "COSINE_OVER_BROADCAST_DIM", "OVERLAP_ON_LOGITS", "EMBEDDING_DIM_POOLED", "LABEL_SMOOTHING_TOO_HIGH", "KL_DIV_MEAN_REDUCTION", "PREDICTION_DETACHED", "TEACHER_TRAINED", "GATHER_ALONG_BATCH", "EINSUM_NOT_CONTRACTED", "SORT_ALONG_LAST_DIM", "TARGET_MAPS_VANISH", "NOISE_NOT_GAUSSIAN",
             "LOSS_WEIGHTS_AFTER_MEAN", "LOSS_SQUARES_MEAN", "SOFTMAX_OFF_AXIS", "LOSS_LOG_OF_PROBABILITY",
             "MASK_FILLED_WITH_ZERO", "LOSS_REDUCTIONS_MIXED", "SCATTER_OVERWRITES", "GENERATED_RANGE_MISMATCH",
             "LOSS_PAIR_ROWS_INTERLEAVED", "TARGET_TILED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        calls = probe.criterion_calls
        findings.data.update(criteria=sorted({call.function for call in calls}), activations=probe.activations)
        findings.data["summary"] = ", ".join(findings.data["criteria"]) or "no known criterion seen"
        for found in [*loss_input_findings(calls, probe.activations), *norm_dim_findings(calls),
                      *kl_norm_dim_findings(calls), *output_range_findings(calls),
                      *broadcast_findings(calls), *column_broadcast_findings(probe.column_broadcasts, calls),
                      *bounded_logit_findings(calls), *pooled_class_findings(calls), *class_dim_findings(calls),
                      *criterion_arg_findings(probe.criterion_args), *pitfall_findings(probe.pitfalls)]:
            findings.add(found.severity, found.code, found.message, found.fix)
        if probe.per_sample_broadcast is not None:
            found = probe.per_sample_broadcast
            rows = found.coefficient[0]
            findings.error(
                "LOSS_BROADCAST",
                f"a per-sample coefficient of shape ({rows},), read from a table by each sample's index (a diffusion "
                f"loss's alphas_cumprod[t], a per-sample weight or scale), meets a ({rows}, {rows}) tensor in `{found.op}`: "
                f"broadcasting aligns the ({rows},) vector with the LAST axis, so each feature column gets another "
                f"sample's coefficient. It only runs because the batch size equals the {rows} features (any other "
                "batch size raises); every sample is noised or weighted with the wrong values",
                "Give the coefficient one value per row: alphas_cumprod[t][:, None] (or .view(-1, *[1] * (x.dim() - 1)) "
                "for images) before multiplying it with the (B, D) tensor.",
            )
        if probe.mixed_reductions is not None:
            findings.warning("LOSS_REDUCTIONS_MIXED", *_mixed_reductions_text(probe.mixed_reductions))
        if probe.log_of_probability:
            taken = " and ".join(f"log({what})" for what in probe.log_of_probability)
            findings.warning(
                "LOSS_LOG_OF_PROBABILITY",
                f"the loss takes {taken} directly, a hand-written cross-entropy on probabilities: once the "
                "activation saturates (a logit beyond about 17 in float32, far less in bf16/fp16) the probability is "
                "exactly 0 or 1, log returns -inf and the loss turns inf or NaN, and before that its gradient "
                "vanishes. The built-in losses compute the same value from the logits, stably",
                "Compute the loss from the logits: F.binary_cross_entropy_with_logits(logits, y) (or F.logsigmoid(z) "
                "for log(sigmoid(z)) and F.logsigmoid(-z) for log(1 - sigmoid(z))); F.log_softmax(z, dim) or "
                "F.cross_entropy(z, y) instead of log(softmax(z)).",
            )
        if probe.batch_normalize is not None:
            shape, dim = probe.batch_normalize
            findings.error(
                "LOSS_NORM_DIM",
                f"F.normalize(z, dim={dim}) runs over the batch of a {shape} tensor: it scales each feature column to "
                "unit norm across the batch instead of each sample's vector to unit length, so the 'cosine' scores "
                "are not cosines and every sample's embedding depends on the other samples of its batch",
                "Normalise each sample's vector: F.normalize(z, dim=-1) (dim=1 of a (batch, features) tensor).",
            )
        if probe.batch_softmax is not None and not any(issue.code == "LOSS_NORM_DIM" for issue in findings.issues):
            function, shape = probe.batch_softmax
            if function == "logsumexp":
                findings.error(
                    "LOSS_NORM_DIM",
                    f"the step takes a logsumexp over dim 0, the batch, of a {shape} tensor computed from the model: "
                    "a mixture's log-likelihood log sum_k pi_k N(y | mu_k, sigma_k) (or any log-sum over "
                    "alternatives) is summed across the samples of the batch instead of across each sample's "
                    "components, so the likelihood mixes different samples and never marginalises the components",
                    "Reduce over the components of each sample: torch.logsumexp(log_pi + component_log_prob, dim=1) "
                    "(dim=-1 for (N, ..., K)), then average over the batch.",
                )
            else:
                findings.error(
                    "LOSS_NORM_DIM",
                    f"the step (model forward or loss) takes a {function} over dim 0, the batch, of a {shape} tensor "
                    "computed from the model: each sample's values are normalised against the other samples of its "
                    "batch (each pixel's or position's class probabilities do not sum to 1; attention weights spread "
                    "over the batch instead of each sample's positions), so the loss rewards one sample outscoring the "
                    "rest and every prediction depends on its batch-mates",
                    f"Normalise over the sample's own axis: torch.{function}(logits, dim=1) for (N, C, ...) class "
                    "logits, dim=1 for (N, T, 1) attention scores over positions (dim=-1 for (N, ..., C)).",
                )
        weighted = next((call.frequent_class_weights for call in calls if call.frequent_class_weights), None)
        if weighted is not None and weighted.permuted:
            findings.warning(
                "LOSS_CLASS_WEIGHTS",
                f"the {weighted.function} class weights are in another order than the class ids: {weighted.detail}. "
                "The weight tensor is indexed by class id; a list built in frequency order (pandas value_counts(), "
                "Counter.most_common(), np.unique sorted by count) hands each class another class's weight",
                "Build the weights by class id: weight = torch.tensor([total / (n_classes * counts[c]) for c in "
                "range(n_classes)]) (or torch.bincount(train_labels) inverted), not in value_counts order.",
            )
        elif weighted is not None:
            findings.warning(
                "LOSS_CLASS_WEIGHTS",
                f"the {weighted.function} class weights favour the frequent classes: {weighted.detail}. Weights that "
                "rise with the class counts (the counts, or positives / negatives, where the inverse was meant; or "
                "inverse frequencies listed in another order than the class ids, such as Counter(labels).values(), "
                "which follows the order the classes first appear in the data) amplify the imbalance they were meant "
                "to correct, and the rare classes are all but ignored",
                "Weight each class by the inverse of its frequency, indexed by class id: counts = torch.bincount("
                "labels, minlength=n_classes); weight = counts.sum() / (n_classes * counts) for cross_entropy, "
                "pos_weight = negatives / positives for BCEWithLogitsLoss.",
            )
        if probe.labels_tiled is not None:
            name, views, source = probe.labels_tiled
            findings.error(
                "TARGET_TILED",
                f"{name}'s targets are the batch's labels tiled with .repeat({views}) (label i at rows i, i + B, ...), "
                f"while the model read a {source} batch tensor flattened sample by sample (sample i's {views} crops or "
                f"views at rows i * {views} .. i * {views} + {views - 1}): every crop is scored against another "
                "sample's label, so the model learns labels unrelated to its inputs",
                f"Expand the labels in the rows' order: y.repeat_interleave({views}) (or y[:, None].expand(-1, "
                f"{views}).reshape(-1)); y.repeat({views}) only matches views stacked view by view, "
                "crops.transpose(0, 1).flatten(0, 1).",
            )
        if probe.targets_tiled_against_rows is not None and probe.labels_tiled is None:
            op, rows, views = probe.targets_tiled_against_rows
            findings.error(
                "TARGET_TILED",
                f"the loss compares ({op}) a model output flattened from ({rows}, {views}), sample by sample (sample "
                f"i's {views} values at rows i * {views} .. i * {views} + {views - 1}: several quantiles, horizons or "
                f"heads), with the batch's ({rows},) targets tiled by .repeat({views}) (target i at rows i, i + {rows}, "
                "...): almost every output is scored against another sample's target, so the model learns targets "
                "unrelated to its inputs",
                f"Expand the targets in the outputs' order: y.repeat_interleave({views}) (or y[:, None].expand(-1, "
                f"{views}).reshape(-1)); or keep the (B, {views}) shape and compare with y[:, None].",
            )
        if probe.pairs_interleaved is not None:
            name, count, rows, source = probe.pairs_interleaved
            findings.error(
                "LOSS_PAIR_ROWS_INTERLEAVED",
                f"{name} gets {count} consecutive row blocks ({rows} rows each) of one forward whose input was a "
                f"{source} batch tensor flattened sample by sample: its rows run anchor 0, positive 0, "
                f"{'negative 0, ' if count == 3 else ''}anchor 1, ..., so .chunk({count}) gives each block every "
                "role of a part of the samples instead of one role of all of them; anchors are compared with "
                "unrelated rows and the loss teaches nothing about which samples belong together",
                f"Split the forward by role: emb.view(-1, {count}, emb.shape[-1]).unbind(1) (or index "
                f"emb[0::{count}], emb[1::{count}], ...); or stack the roles first, torch.cat([a, p, n]) along dim 0, "
                "before one forward and .chunk.",
            )
        if probe.range_mismatch is not None:
            found = probe.range_mismatch
            low, high = found.data_range
            findings.warning(
                "GENERATED_RANGE_MISMATCH",
                f"one layer reads the batch's data ({found.shape}, 90% of it between {low:.3g} and {high:.3g}; "
                f"{found.outside:.0%} outside [{found.low:g}, {found.high:g}]) and a {found.activation} output, which "
                f"never leaves [{found.low:g}, {found.high:g}]: a GAN discriminator given real samples that were not "
                f"scaled to the generator's {found.activation} range tells real from generated by range alone, and "
                "the generator can never produce what it imitates (so does a consistency term comparing data with a "
                "bounded reconstruction)",
                f"Scale the data into [{found.low:g}, {found.high:g}] before training (images: x / 127.5 - 1 for "
                "tanh, x / 255 for sigmoid; other data: a min-max or a fixed scale) and undo it on generated samples; "
                "or drop the output activation.",
            )
        if probe.sliced_pair is not None:
            pair = probe.sliced_pair
            findings.error(
                "LOSS_PAIR_SLICES",
                f"{pair.function} compares inputs of shape {pair.shape} that are column slices of the same rows of "
                f"one tensor with {pair.row_length} features per row (a .chunk/.split along the last dim): each "
                "'anchor' is compared with other features of its own embedding, never with another sample, so the "
                "loss is solved without learning anything about the samples",
                "Split a stacked forward along the rows: emb.chunk(k, dim=0) (anchor, positive, negative of a "
                "torch.cat([...]) of the batches), not dim=-1.",
            )


class TargetsCheck(Check):
    """O14: classification targets outside [0, C) or of the wrong dtype for the criterion;
    targets all or mostly ignore_index, of one class only, or multi-hot rows fed to
    cross_entropy (``target_profile``)."""

    name = "step.targets"
    stage = Stage.STEP
    codes = ("O14", "TARGET_ALL_IGNORED", "TARGET_MOSTLY_IGNORED", "TARGET_ONE_CLASS", "TARGET_MULTI_HOT",
             "TARGET_SCALE", "TARGET_IGNORED_CLASS", "TARGET_TRUNCATED", "TARGET_CLASS_IDS_REGRESSED", "TARGET_ORDER",
             "TARGET_ZERO_ONE_SIGN", "TARGET_IS_INPUT", "DIFFUSION_NOISE_NEVER_HIGH", "TARGET_ALWAYS_ON",
             "TARGET_LEVEL_ALWAYS_ON", "TARGETS_FROM_UNTRAINED_MODEL", "TARGET_COLUMN_REUSED",
             "TARGET_FEW_CLASSES", "TARGET_COLUMN_SCALES", "OUTPUT_PRECISION_COARSE")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        calls = probe.criterion_calls
        levels = [call.cumulative_levels for call in calls if call.cumulative_levels is not None]
        first_level_always_on = bool(levels) and all(first_always_on for _, _, first_always_on in levels)
        on = next((call.always_on_label for call in calls if call.always_on_label), None)
        # Cumulative (ordinal) levels y > k are set most often at k = 0 by construction: no padding label.
        if on is not None and not levels:
            column, rate, median = on
            findings.warning(
                "TARGET_ALWAYS_ON",
                f"label {column} of the multi-hot targets is set in {rate:.0%} of the rows while the median label is "
                f"set in {median:.0%}: a label that is nearly always 1 is usually not a label but something set on "
                f"every row, such as the padding value of variable-length label lists (pad_sequence(padding_value="
                f"{column}) before scatter_) colliding with label {column}; its head learns to always say yes",
                "Pad the label lists with a value that is no label (e.g. -1, or num_labels, then drop that column), "
                "or build the multi-hot rows from each sample's own list before batching.",
            )
        guessed = probe.labels_from_initial_guesses
        if guessed is not None and guessed.argmax_agreement is not None:
            agreement = guessed.argmax_agreement
            findings.warning(
                "TARGETS_FROM_UNTRAINED_MODEL",
                f"{guessed.function}'s targets, as the DataLoader delivers them, are the untrained model's own "
                f"predictions: on {agreement.agreement:.0%} of {agreement.rows} rows the target is the argmax of the "
                f"model's logits at its initial weights (two unrelated labellings with these class shares agree on "
                f"{agreement.chance:.0%}). Pseudo-labels computed once, before training (model(x_unlabelled)"
                ".argmax(1) when the dataset is built), teach the model to repeat its random initial guesses; they "
                "never improve as it learns",
                "Compute the pseudo-labels from the current model inside the loss (with torch.no_grad() and a "
                "confidence threshold, e.g. softmax(...).max(1) > 0.95), recompute them every epoch from the model as "
                "it trains, or take them from a trained teacher.",
            )
        if first_level_always_on:
            rows, width = sum(n for n, _, _ in levels), levels[0][1]
            findings.warning(
                "TARGET_LEVEL_ALWAYS_ON",
                f"the {width} binary targets of each row are cumulative levels (ones, then zeros: an ordinal grade "
                f"encoded as 'grade > k') and the first level is 1 in all {rows} rows: the levels were built as "
                "y >= k for k = 0 .. K-2, which is true at k = 0 for every grade, so the first output learns a "
                "constant, the highest grade is never encoded and every decoded grade (the count of levels above "
                "0.5) comes out one rank too high",
                f"Encode level k as y > k for k in 0 .. K-2: (y.unsqueeze(1) > torch.arange({width})).float(), so "
                "grade 0 is all zeros and the highest grade all ones.",
            )
        if probe.diffusion_noise is not None and probe.diffusion_noise[0] < LOW_NOISE_SHARE:
            share, samples = probe.diffusion_noise
            findings.warning(
                "DIFFUSION_NOISE_NEVER_HIGH",
                f"the diffusion loss's forward process never reaches high noise: over the {samples} samples of the "
                f"batch, each at its own timestep, the noise is at most {share:.1%} of x_t's variance (x_t = a * x0 + "
                "b * noise, solved per sample), where the last timesteps should be almost pure noise. The model "
                "never learns to denoise from the noise sampling starts at. alpha_bar taken as the per-step alphas "
                "(1 - betas) instead of their cumulative product does this",
                "Build the schedule's cumulative product: alpha_bar = torch.cumprod(1 - betas, dim=0), and noise with "
                "x_t = alpha_bar[t].sqrt() * x0 + (1 - alpha_bar[t]).sqrt() * noise (its last values near 0).",
            )
        if probe.target_is_input is not None:
            function, shape, made_in_loss = probe.target_is_input
            made = (" The input is computed inside the loss from the batch: in a diffusion step that is the noised "
                    "x_t = sqrt(a_t) * x0 + sqrt(1 - a_t) * noise, and regressing x_t teaches the model to reproduce "
                    "its noisy input instead of predicting the noise it must remove" if made_in_loss else "")
            findings.error(
                "TARGET_IS_INPUT",
                f"{function}'s target is the model's own input ({shape}), while the batch holds another, different "
                "tensor of that shape: the model learns the identity map, which it reaches by copying its input (a "
                "denoiser compared with its noisy or corrupted input learns to keep the noise, an enhancer to change "
                f"nothing).{made}",
                ("Compare the prediction with the noise that was added: mse_loss(model(x_t, t), noise) (or with the "
                 "clean x0 for an x0-prediction model), not with x_t. " if made_in_loss else "")
                + "Give the criterion the batch's target tensor (e.g. the clean signal: loss_fn(model(noisy), clean)), "
                "not the input the model was fed.",
            )
        if probe.target_fed_beside is not None:
            function, shape, index = probe.target_fed_beside
            findings.error(
                "TARGET_IS_INPUT",
                f"{function}'s target ({shape}) is, value for value, the model's input number {index + 1}: the model is "
                "handed the very values it must predict beside its other input. In a sequence-to-sequence model this "
                "is teacher forcing without the shift: the decoder input is the target itself (dec_in = y), not y "
                "shifted right by one step, so at step t the decoder is given the value it must predict, learns to "
                "copy it, and forecasts flat (or garbage) once it runs on its own outputs",
                "Shift the decoder input right by one step: dec_in = torch.cat([x[:, -1:], y[:, :-1]], dim=1) (the last "
                "observed value, then the targets up to t - 1); for tokens, [bos] + y[:-1].",
            )
        if probe.zero_one_sign_target:
            findings.error(
                "TARGET_ZERO_ONE_SIGN",
                f"{probe.zero_one_sign_target} (nn.{SIGN_MODULES[probe.zero_one_sign_target]}) gets 0/1 targets, "
                "but it reads +1 (similar / ranked first) and -1 (dissimilar / ranked second): a label of 0 is "
                "neither, and those pairs contribute no gradient (exactly zero loss in the embedding losses), so they "
                "never push apart and the model can map everything to one point",
                f"Convert the labels to -1/+1 before nn.{SIGN_MODULES[probe.zero_one_sign_target]}: "
                "target = labels * 2 - 1 (0 -> -1, 1 -> +1).",
            )
        findings.data["targets"] = [
            {"criterion": c.function, "dtype": c.target.dtype, "min": c.target.min, "max": c.target.max,
             "classes": c.n_classes}
            for c in calls if c.target is not None
        ]
        described = [t for t in findings.data["targets"] if t["min"] is not None]
        findings.data["summary"] = "; ".join(
            f"{t['criterion']}: {t['dtype']} targets in [{t['min']:g}, {t['max']:g}]" + (f" for {t['classes']} classes" if t["classes"] else "")
            for t in described
        ) or "no known criterion seen"
        ignored = [c for c in calls if all_ignored(c)]
        if ignored:
            findings.data["summary"] = f"{ignored[0].function}: all {ignored[0].profile.total} targets are ignore_index"
        reported = _nan_from_ignored_targets(probe) is not None  # by step.first_step
        for found in [*target_findings(calls), *profile_findings(calls), *regression_scale_findings(calls),
                      *truncated_target_findings(calls), *output_precision_findings(calls)]:
            if not (found.code == "TARGET_ALL_IGNORED" and reported):
                findings.add(found.severity, found.code, found.message, found.fix, "data.train")
        if probe.time_major_target is not None:
            function, shape, model_input = probe.time_major_target
            findings.error(
                "TARGET_ORDER",
                f"{function}'s targets are a {shape} = (T, B) batch tensor flattened as it is, in (position, sample) "
                f"order, while the model reads batch-first {model_input} inputs, so its flattened logits are in "
                "(sample, position) order: almost every prediction is scored against another token's target",
                "Flatten the targets in the logits' order: targets.t().reshape(-1) (or transpose the time-major batch "
                "once, in the collate_fn, so text and targets are both (B, T)).",
                "data.train",
            )
        found = _single_output_classifier(ctx, calls)
        if found is not None:
            findings.warning("TARGET_CLASS_IDS_REGRESSED", *found)
        if probe.argmaxed_multi_hot is not None:
            found = probe.argmaxed_multi_hot
            findings.error(
                "TARGET_MULTI_HOT",
                f"{found.function}'s class targets are the argmax of the batch's multi-hot {found.shape} labels, and "
                f"{found.multi_rows:.0%} of those rows hold two labels or more (up to {found.most_labels}): argmax keeps "
                "only the lowest-index label of each sample as its one class, and the softmax pushes the sample's other "
                "true labels down, so the model learns the label order, not the labels",
                "Train the multi-label target as it is: BCEWithLogitsLoss()(logits, labels.float()) on the multi-hot "
                "tensor (no argmax), and predict with torch.sigmoid(logits) > threshold; keep cross_entropy for data "
                "with exactly one label per sample.",
                "data.train",
            )
        if probe.target_column_reused is not None:
            terms, twice, unused, columns = probe.target_column_reused
            findings.warning(
                "TARGET_COLUMN_REUSED",
                f"{len(terms)} loss terms ({', '.join(terms)}) are fitted to the same target, column {twice} of the "
                f"batch's (B, {columns}) targets, while column {unused} is the target of no term: a multi-task loss "
                f"copy-pasted without changing the column (y[:, {twice}] twice), so a second head learns the first "
                f"task and the task of column {unused} is never trained",
                f"Give each head its own column: loss = mse(out[:, 0], y[:, 0]) + mse(out[:, 1], y[:, 1]); check "
                f"which term should read y[:, {unused}].",
            )
        if probe.target_column_scales is not None and probe.target_column_scales.fields:
            found = probe.target_column_scales
            findings.warning(
                "TARGET_COLUMN_SCALES",
                f"{found.function}'s targets are {found.columns} fields on scales far apart: channel {found.wide} "
                f"spreads with a std of {found.wide_std:.3g}, channel {found.narrow} with {found.narrow_std:.3g} "
                f"({found.wide_std / found.narrow_std:.0f}x less), so one raw {found.function} over all channels "
                f"gives channel {found.narrow} {found.share:.2g} of the loss: the model learns the wide field and the "
                "narrow one contributes nothing. Physical fields in their own units (a pressure in pascals beside a "
                "velocity in m/s) do this",
                "Normalise each output channel by its training-set std before the loss (((pred - target) / "
                "channel_std) ** 2).mean(), with channel_std of shape (1, C, 1, ...), or standardise the target "
                "fields per channel in the dataset.",
                "data.train",
            )
        elif probe.target_column_scales is not None:
            found = probe.target_column_scales
            findings.warning(
                "TARGET_COLUMN_SCALES",
                f"{found.function}'s (B, {found.columns}) targets have columns on scales far apart: column "
                f"{found.wide} spreads with a std of {found.wide_std:.3g}, column {found.narrow} with "
                f"{found.narrow_std:.3g} ({found.wide_std / found.narrow_std:.0f}x less), so one {found.function} over "
                f"all columns gives column {found.narrow} {found.share:.2g} of the loss at a prediction of the column means: the shared layers learn the "
                f"wide column(s) and column {found.narrow} is left near its mean. Targets in their own units "
                "(a price beside a rate, metres beside a fraction) do this",
                "Standardise each target column with the training set's statistics: y = (y - y.mean(0)) / y.std(0) "
                "(invert it on the predictions); or compute the loss per column and weight the columns.",
                "data.train",
            )
        if probe.boxes_beyond_image is not None and probe.boxes_beyond_image.points:
            found = probe.boxes_beyond_image
            findings.warning(
                "TARGET_SCALE",
                f"{found.beyond:.0%} of the {found.shape} (x, y) point targets of {found.function} lie past the image "
                f"(above 1, up to {found.largest:.3g}) though most are normalised to [0, 1]: the points are divided by "
                "the wrong side. PIL's Image.size is (width, height) while a numpy image's shape is (height, width): "
                "h, w = img.size divides x by the height and y by the width, which on images that are not square "
                "gives the same position different targets depending on an aspect ratio the resized input no "
                "longer shows",
                "Normalise x by the width and y by the height: w, h = img.size for a PIL image (h, w = arr.shape[:2] "
                "for a numpy one), then (x / w, y / h).",
                "data.train",
            )
        elif probe.boxes_beyond_image is not None:
            found = probe.boxes_beyond_image
            unit = ("normalised to [0, 1]" if found.side == 1.0 else
                    f"in pixels of the {found.image[0]}x{found.image[1]} input")
            findings.warning(
                "TARGET_SCALE",
                f"{found.beyond:.0%} of the {found.shape} box targets of {found.function} end past the image "
                f"(x2 or y2 above {found.side:g}; the largest corner is {found.largest:.3g}), with the boxes {unit}: "
                "the boxes are not in the image's coordinates. Images resized (or cropped) in the dataset while their "
                "boxes stay in the original image's pixels do this: the same object gets a box scaled by a factor "
                "the model cannot see, different for every image size",
                "Scale each box with its image: box * [new_w / old_w, new_h / old_h, new_w / old_w, new_h / old_h] "
                "when resizing (torchvision.transforms.v2 with tv_tensors.BoundingBoxes does it for you), then "
                "normalise by the resized size.",
                "data.train",
            )
        candidate = next((c for c in calls if one_class_candidate(c)), None)
        if candidate is not None and label_leaf(ctx.artifacts.first_batch, candidate) is None:
            found = made_target_finding(candidate) or collapsed_target_finding(candidate, ctx.artifacts.first_batch)
            if found is not None:
                findings.add(found.severity, found.code, found.message, found.fix)
        elif candidate is not None:
            seen, batches, whole_epoch = scan_labels(ctx, findings, self.name, candidate)
            findings.data["one_class_scan"] = {"targets": seen, "batches": batches, "whole_epoch": whole_epoch}
            found = one_class_finding(candidate, seen, batches, whole_epoch)
            if found is not None and _labels_copy_inputs(ctx.artifacts.first_batch, candidate.ignore_index):
                found.message += (". The labels equal input_ids at every position the loss trains on: they were "
                                  "copied from the inputs after the inputs were masked, so the target is the mask id")
                found.fix = ("Clone the labels before masking the inputs (labels = input_ids.clone(), then replace the "
                             "chosen input positions with the mask id), and set labels to -100 where no token was "
                             "masked; transformers' DataCollatorForLanguageModeling does this.")
            if found is not None:
                findings.add(found.severity, found.code, found.message, found.fix, "data.train")
        self._few_classes(ctx, calls, findings)

    def _few_classes(self, ctx: PreflightContext, calls: list, findings: Findings) -> None:
        call = next((c for c in calls if few_classes_candidate(c)), None)
        index = per_sample_label_leaf(ctx.artifacts.first_batch, call) if call is not None else None
        if call is None or index is None or ctx.artifacts.data_hang is not None:
            return
        used, seen, whole_epoch = scan_classes(ctx, findings, self.name, call, index)
        findings.data["class_scan"] = {"classes": used, "targets": seen, "whole_epoch": whole_epoch}
        classes = call.n_classes or 0
        if len(used) > classes // 2 or not seen or (seen < few_classes_enough(classes) and not whole_epoch):
            return
        validated = None
        if ctx.val_loader is not None:
            validated, _, _ = scan_classes(ctx, findings, self.name, call, index, ctx.val_loader)
        message, fix = few_classes_message(call, used, seen, whole_epoch, validated)
        findings.warning("TARGET_FEW_CLASSES", message, fix, "data.train")


def _labels_copy_inputs(batch: object, ignore_index: int | None) -> bool:
    """A mapping batch whose labels equal its input_ids wherever they are not ignored."""
    if not isinstance(batch, Mapping):
        return False
    ids, labels = batch.get("input_ids"), batch.get("labels")
    if not (isinstance(ids, torch.Tensor) and isinstance(labels, torch.Tensor)) or ids.shape != labels.shape:
        return False
    kept = labels != (ignore_index if ignore_index is not None else -100)
    return bool(kept.any()) and bool((labels[kept] == ids.to(labels.device)[kept]).all())


def _mixed_reductions_text(found: MixedReductions) -> tuple[str, str]:
    collapse = ("In a VAE the KL term wins: the posterior collapses to the prior and the decoder learns only the "
                "mean image (or spectrum)")
    if found.kind == "values":
        per_sample = math.prod(found.averaged[1:])
        return (f"the loss adds {found.criterion} averaged over each sample's {per_sample:,} values (a {found.averaged} "
                f"input) to a term summed over each sample's {math.prod(found.summed[1:]):,} values (a {found.summed} "
                f"tensor): per value the summed term weighs {found.factor:,.0f} times more, so it dominates the "
                f"gradient. {collapse}: a reconstruction averaged over pixels (reduction='mean', the default) beside "
                "a KL summed over the latents",
                "Reduce the terms alike per sample: sum the reconstruction over its values too "
                f"({found.criterion}(recon, x, reduction='sum') / batch_size beside kl.sum() / batch_size), or average "
                "both, and weigh them on purpose (beta * kl).")
    if found.kind == "batch":
        return (f"the loss adds a term summed over the batch (dim 0 of a {found.summed} tensor, the rest averaged: "
                f"x.sum(dim=0).mean()) to {found.criterion} averaged over the batch: the summed term weighs "
                f"{found.factor:,.0f} times more and grows with the batch size. {collapse}: kl.sum(dim=0).mean() sums "
                "the samples where kl.sum(dim=1).mean() (the latents) is meant",
                "Sum over each sample's values and average over the batch: kl.sum(dim=1).mean() (dim=1, the latents; "
                "dim=0 is the batch).")
    per_element = math.prod(found.averaged)
    return (f"the loss adds {found.criterion} averaged over all {per_element:,} values of its {found.averaged} input "
            f"to a term summed over a {found.summed} tensor, the batch included: per value, the summed term weighs "
            f"{per_element:,} times more than the averaged one, so it dominates the gradient. {collapse}",
            "Reduce the terms alike: sum each per sample and average over the batch (F.mse_loss(recon, x, "
            "reduction='sum') / B + kl.sum() / B), or average both, and weigh them on purpose (beta * kl).")


def _single_output_classifier(ctx: PreflightContext, calls: list[CriterionCall]) -> tuple[str, str] | None:
    """A Hugging Face model built with num_labels=1 for class labels: with one output it
    sets problem_type='regression' and trains mse_loss on the class ids as numbers."""
    config = getattr(ctx.model, "config", None)
    if getattr(config, "num_labels", None) != 1:
        return None
    call = next((c for c in calls if c.function == "mse_loss" and c.target is not None and c.target.min is not None
                 and _class_ids(c.target)), None)
    if call is None:
        return None
    classes = int(call.target.max - call.target.min) + 1
    binary = classes == 2
    cast = (" (cast to float: the dtype error MSELoss raises on integer labels is this mismatch, not a fix to make)"
            if call.target.is_floating else "")
    return (
        f"the model's config has num_labels=1, so Hugging Face treats the task as a regression (problem_type="
        f"'{getattr(config, 'problem_type', None) or 'regression'}') and trains mse_loss between one output score "
        f"and class labels {call.target.min:g}..{call.target.max:g}{cast}: the classes are scored as ordered numbers "
        "and the single logit's argmax is always class 0"
        + (" (a two-class task needs num_labels=2 for cross-entropy, or BCE on one logit)" if binary else ""),
        f"Build the model with one output per class: from_pretrained(..., num_labels={classes}) or "
        f"Config(num_labels={classes}) (num_labels counts the classes, not the labels per sample); keep num_labels=1 "
        "only for a real-valued target given as floats.",
    )


def _class_ids(target: Any) -> bool:
    """Labels that read as class ids: integers spanning 3 values or more, or 0/1; floats that
    are whole numbers 0..K-1 with every one present (ratings start at 1; scores are not whole)."""
    if not target.is_floating:
        return target.max - target.min >= 2 or (target.min == 0 and target.max == 1)
    return bool(target.whole and target.min == 0 and target.distinct is not None
                and target.distinct == int(target.max) + 1 >= 2)


class InitialLossCheck(Check):
    """O1 "verify the loss at init": ~ln(C) for a fresh classifier."""

    name = "step.initial_loss"
    stage = Stage.STEP
    codes = ("O1",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        found, data = init_loss_finding(probe.criterion_calls)
        findings.data.update(data)
        if data.get("applicable"):
            findings.data["summary"] = f"loss {data['loss']:.3f} vs ln({data['classes']}) = {data['ln_classes']:.3f}"
        if found is not None and probe.normalized and found.severity == "warning":
            # Cosine logits times a scale (ArcFace, CosFace: s = 30-64, a margin on the target) start far
            # above ln(C) by design; the margin keeps the loss high until the classes separate.
            findings.info("O1", found.message + ". The step normalises embeddings (F.normalize): cosine logits "
                          "scaled by s with a margin on the target class (ArcFace, CosFace) start this high by design",
                          found.fix, "model")
        elif found is not None:
            findings.add(found.severity, found.code, found.message, found.fix, "model")


class PaddedLossCheck(Check):
    """O15: padding reaches the loss: a mean over padded positions (no ignore_index, no
    mask), or a mask divided by every position; read from what reached the criterion."""

    name = "step.padded_loss"
    stage = Stage.STEP
    codes = ("O15", "LOSS_MASK_INVERTED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        padded = [c.padding for c in probe.criterion_calls if c.padding is not None]
        findings.data["padding"] = [
            {"id": p.value, "side": p.side, "rows": p.padded_rows, "positions": p.positions, "share": round(p.share, 4)}
            for p in padded
        ]
        findings.data["summary"] = (f"padding id {padded[0].value} in {padded[0].share:.0%} of the targets"
                                    if padded else "no padding in the targets the criterion trains on")
        returned = probe.loss.value if probe.loss is not None else None
        for found in padded_loss_findings(probe.criterion_calls, returned, ctx.artifacts.first_batch):
            findings.add(found.severity, found.code, found.message, found.fix, code_fix=found.code_fix)
