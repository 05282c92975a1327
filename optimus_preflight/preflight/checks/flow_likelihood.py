"""A normalising flow's negative log-likelihood put together wrongly (``step.flow_likelihood``).

A flow maps the data x to a latent z and returns log|det dz/dx|; its density is the change of
variables log p(x) = log p_base(z) + log|det dz/dx|, and the loss is the mean of its negative.
Each of the two terms can be wired wrongly without a crash: the log-determinant detached
(`logdet.detach()`), subtracted instead of added, the base density taken of the data x instead
of z, or the two terms weighted differently (the base log-density summed over the batch to one
number, or left per dimension next to a per-sample log-determinant). The loss still falls; the
flow learns a wrong density (it collapses, or over-expands, or never moves the latent).

Read from the model and the loss, not the code. The model must be a flow: one float input of
at most 128 values per sample, outputs holding a z with as many values and one number per
sample that equals log|det dz/dx| (the Jacobian measured by autograd for two samples). The loss
of the first batch is then differentiated with respect to those two outputs: a correct NLL
lowers the loss as the log-determinant grows (d loss / d logdet = -w per sample) and, for a
standard normal base, has d loss / d z = w * z with the same w.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from optimus_preflight.preflight.analyses.eval_forward import model_call
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_DIMS = 128  # one backward pass per latent value, for each of two samples
SAMPLES = 2
LOGDET_TOLERANCE = 1e-2  # relative, on log|det J| (float32 Jacobians of deep flows)
PROPORTIONAL = 1e-3  # relative residual of d loss / d z against a multiple of z
WEIGHT_MATCH = 0.05  # relative distance of the base / log-det weight ratio to B, D or 1 / D


def flow_parts(x: torch.Tensor, outputs: list[torch.Tensor]) -> tuple[int, int] | None:
    """The positions of (z, logdet) among the model's outputs: z has as many values as x, logdet
    one per sample; None when the outputs hold no such pair."""
    batch = x.shape[0]
    latent = [i for i, out in enumerate(outputs) if out.is_floating_point() and out.shape[0] == batch
              and out.numel() == x.numel() and out.dim() >= 2]
    logdet = [i for i, out in enumerate(outputs) if out.is_floating_point() and out.shape[0] == batch
              and out.numel() == batch]
    if len(latent) != 1 or len(logdet) != 1:
        return None
    return latent[0], logdet[0]


def tensor_outputs(output: Any) -> list[torch.Tensor]:
    return [leaf for leaf in leaves(output) if isinstance(leaf, torch.Tensor) and leaf.dim() > 0]


def logdet_matches_jacobian(model: nn.Module, x: torch.Tensor, parts: tuple[int, int]) -> bool:
    """Whether the model's logdet output is log|det dz/dx| for each of the first samples."""
    for i in range(min(SAMPLES, len(x))):
        sample = x[i:i + 1].detach().clone().requires_grad_(True)
        outputs = tensor_outputs(model(sample))
        if len(outputs) <= max(parts):
            return False
        z, logdet = outputs[parts[0]].reshape(-1), outputs[parts[1]].reshape(-1)
        if z.numel() != sample.numel() or logdet.numel() != 1:
            return False
        rows = []
        for d in range(z.numel()):
            (grad,) = torch.autograd.grad(z[d], sample, retain_graph=True, allow_unused=True)
            if grad is None:
                return False
            rows.append(grad.reshape(-1))
        _, measured = torch.linalg.slogdet(torch.stack(rows).double())
        claimed = float(logdet.detach().double())
        if not math.isfinite(float(measured)) or \
                abs(claimed - float(measured)) > LOGDET_TOLERANCE * max(1.0, abs(float(measured))):
            return False
    return True


class FlowGradients(NamedTuple):
    """The loss's gradient with respect to a flow's two outputs on the first batch; a gradient is
    None where the loss does not reach that output."""

    z: torch.Tensor
    grad_z: torch.Tensor | None
    grad_logdet: torch.Tensor | None
    logdet_trained: bool  # the parameters move the log-determinant (a volume-preserving flow's does not)


def loss_gradients(ctx: PreflightContext, parts: tuple[int, int]) -> FlowGradients | None:
    """The gradients of the first batch's loss in eval mode; None when the loss cannot be taken.
    A loss that calls the model more than once on the batch (z from one call, the log-determinant
    from another) is judged on the gradients of all its calls together."""
    calls: list[list[torch.Tensor]] = []

    def keep(module: nn.Module, args: Any, output: Any) -> None:
        outputs = tensor_outputs(output)
        if len(outputs) > max(parts):
            calls.append(outputs)

    handle = ctx.model.register_forward_hook(keep)
    try:
        with ctx.training.plan.autocast():
            output = ctx.compute_loss(ctx.model, move_to_device(ctx.artifacts.first_batch, ctx.device))
    finally:
        handle.remove()
    loss = output[0] if isinstance(output, tuple) else output
    if not calls or not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        return None
    shape = [t.shape for t in calls[0]]
    calls = [outputs for outputs in calls if [t.shape for t in outputs] == shape]
    gradients = {}
    for position in parts:
        wanted = [outputs[position] for outputs in calls if outputs[position].requires_grad]
        found = [g for g in torch.autograd.grad(loss, wanted, allow_unused=True, retain_graph=True) if g is not None] \
            if wanted else []
        gradients[position] = torch.stack(found).sum(0) if found else None
    logdet = calls[0][parts[1]]
    trains_logdet = logdet.requires_grad and any(
        g is not None and bool(g.abs().sum() > 0)
        for g in torch.autograd.grad(logdet.sum(), [p for p in ctx.model.parameters() if p.requires_grad],
                                     allow_unused=True))
    return FlowGradients(calls[0][parts[0]].detach(), gradients[parts[0]], gradients[parts[1]], trains_logdet)


def base_weight_ratio(z: torch.Tensor, grad_z: torch.Tensor, weight: torch.Tensor) -> float | None:
    """k where d loss / d z = k * w * z for every sample (a standard normal base weighted k times
    the log-determinant), None when the gradient is no multiple of z."""
    z, grad_z = z.reshape(len(z), -1).double(), grad_z.reshape(len(z), -1).double()
    norms = (z * z).sum(1)
    if bool((norms == 0).any()) or bool((weight <= 0).any()):
        return None
    ratios = (grad_z * z).sum(1) / (norms * weight)
    residual = (grad_z - (ratios * weight)[:, None] * z).norm(dim=1) / grad_z.norm(dim=1).clamp_min(1e-30)
    if float(residual.max()) > PROPORTIONAL or float((ratios.max() - ratios.min()).abs()) > \
            PROPORTIONAL * float(ratios.abs().max()):
        return None
    return float(ratios.mean())


def near(value: float, target: float) -> bool:
    return abs(value - target) <= WEIGHT_MATCH * target


class FlowLikelihoodCheck(Check):
    """FLOW_LOGDET_DETACHED, FLOW_LOGDET_SIGN, FLOW_BASE_OFF_LATENT, FLOW_TERMS_WEIGHTED_APART."""

    name = "step.flow_likelihood"
    stage = Stage.STEP
    codes = ("FLOW_LOGDET_DETACHED", "FLOW_LOGDET_SIGN", "FLOW_BASE_OFF_LATENT", "FLOW_TERMS_WEIGHTED_APART")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        call = model_call(ctx, ctx.artifacts.first_batch)
        inputs = call[0] if call is not None else []
        if len(inputs) != 1 or not inputs[0].is_floating_point() or inputs[0].dim() < 2 \
                or not 2 <= inputs[0][0].numel() <= MAX_DIMS:
            findings.data["summary"] = "no single float input of at most 128 values per sample"
            return
        x = inputs[0]
        parts = flow_parts(x, call[1])
        if parts is None:
            findings.data["summary"] = "the model returns no (latent, one value per sample) pair"
            return
        with preserved_training_state(ctx), torch.enable_grad():
            ctx.model.eval()
            try:
                is_flow = logdet_matches_jacobian(ctx.model, x, parts)
                found = loss_gradients(ctx, parts) if is_flow else None
            except Exception:
                findings.data["summary"] = "the Jacobian or the loss's gradient could not be measured"
                return
        if not is_flow:
            findings.data["summary"] = "the per-sample output is not log|det dz/dx|: not a flow"
            return
        if found is None:
            findings.data["summary"] = "the loss could not be differentiated"
            return
        findings.data["summary"] = "a flow: the NLL's two terms read"
        if found.logdet_trained:  # a volume-preserving flow's constant log-determinant may be left out
            self.judge(findings, x, found.z, found.grad_z, found.grad_logdet)

    def judge(self, findings: Findings, x: torch.Tensor, z: torch.Tensor, grad_z: torch.Tensor | None,
              grad_logdet: torch.Tensor | None) -> None:
        latent_read = grad_z is not None and bool(grad_z.abs().sum() > 0)
        if grad_logdet is None or not bool(grad_logdet.abs().sum() > 0):
            if latent_read:
                findings.warning(
                    "FLOW_LOGDET_DETACHED",
                    "the model is a normalising flow (its per-sample output equals log|det dz/dx|, measured by "
                    "autograd) but the loss takes no gradient through that log-determinant: it is detached "
                    "(logdet.detach()) or left out of the NLL. The change of variables log p(x) = log p(z) + "
                    "log|det dz/dx| then loses its volume term, and the flow learns to shrink every sample onto the "
                    "base's mode instead of a density",
                    "Keep the log-determinant in the graph: loss = -(base.log_prob(z).sum(-1) + logdet).mean(), "
                    "without .detach() on logdet.")
            return
        weight = -grad_logdet.reshape(-1).double()
        if bool((weight < 0).all()):
            findings.warning(
                "FLOW_LOGDET_SIGN",
                "the model is a normalising flow (its per-sample output equals log|det dz/dx|) but the loss grows "
                "as that log-determinant grows: it is subtracted where the change of variables adds it (the NLL is "
                "-(log p(z) + log|det dz/dx|)). Minimising -(log p(z) - logdet) rewards contracting every sample "
                "onto the base's mode: the loss falls while the density gets worse",
                "Add the log-determinant: loss = -(base.log_prob(z).sum(-1) + logdet).mean().")
            return
        if not bool((weight > 0).all()):
            return
        if not latent_read:
            findings.warning(
                "FLOW_BASE_OFF_LATENT",
                "the model is a normalising flow (its per-sample output equals log|det dz/dx|) but the loss never "
                "reads its latent z: the base log-density is taken of the data x (base.log_prob(x)), or of another "
                "tensor, instead of the latent z = f(x) the change of variables scores. Nothing then pulls z toward "
                "the base distribution; the couplings only grow the log-determinant",
                "Score the latent the flow returns: z, logdet = flow(x); loss = -(base.log_prob(z).sum(-1) + "
                "logdet).mean().")
            return
        ratio = base_weight_ratio(z, grad_z, weight)
        batch, dims = len(x), x[0].numel()
        if ratio is None:
            return
        if batch > 2 and near(ratio, batch):
            cause = (f"the base term is weighted {ratio:.0f} times (the batch size, {batch}) the log-determinant: "
                     "its log-density is summed over the whole batch to one number (log_prob(z).sum()) and that "
                     "number is added to each sample's log-determinant before the mean")
            fix = "Sum the base log-density per sample only: base.log_prob(z).sum(-1) (shape (B,)), then add logdet."
        elif dims > 1 and near(ratio, 1 / dims):
            cause = (f"the base term is weighted 1/{dims} of the log-determinant: its log-density is left per "
                     f"dimension ((B, {dims})) and the (B,) log-determinant is broadcast across it, so the mean over "
                     f"(B, {dims}) divides the base term by {dims} and the flow over-expands")
            fix = ("Sum the base log-density over the event dimensions before adding the log-determinant: "
                   "base.log_prob(z).sum(-1) + logdet, then the mean over the batch.")
        elif dims > 1 and near(ratio, dims):
            cause = (f"the log-determinant is weighted 1/{dims} of the base term: it is averaged (or divided) over the "
                     f"{dims} dimensions while the base log-density is summed over them")
            fix = ("Weight both terms alike: -(base.log_prob(z).sum(-1) + logdet).mean(), dividing both by the "
                   "dimension count for a per-dimension NLL.")
        else:
            return
        findings.warning(
            "FLOW_TERMS_WEIGHTED_APART",
            "the model is a normalising flow (its per-sample output equals log|det dz/dx|, and the loss's gradient "
            "with respect to z is a standard normal base's) but the NLL weights its two terms differently: "
            f"{cause}. The change of variables log p(x) = log p(z) + log|det dz/dx| needs both per sample, with "
            "equal weight; the flow learns a density of the wrong width",
            fix)
