"""A derivative the loss uses, taken without its graph (``step.derivative_graph``).

``DERIVATIVE_WITHOUT_GRAPH``: ``compute_loss`` calls ``torch.autograd.grad`` without
``create_graph=True`` and puts the result in the loss: a physics-informed residual
``(du/dx - f)^2``, a WGAN-GP gradient penalty, an input-gradient regulariser. The derivative
then comes back as a constant with no graph to the weights, so that term contributes no
gradient at all and the optimizer trains only the rest of the loss.

Measured, not guessed: only when the step calls ``autograd.grad`` with ``create_graph``
off, the weights' gradient is computed twice on the first batch (eval mode, one seed),
once as written and once with ``create_graph=True`` forced into those calls. A derivative
used as data (an FGSM perturbation's ``sign()``) has no gradient either way, so forcing the
graph changes nothing and the check stays quiet; one the loss depends on changes the
weights' gradient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.analyses.autograd_calls import watched_autograd_grad
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

CHANGED = 0.1  # of the gradient's norm: what forcing the graph must change to count
# A field's derivative (u_x, u_xx of a PINN) is never data the way an adversarial perturbation's
# is, so any clear change counts: a residual scaled down beside a boundary term moves little.
FIELD_CHANGED = 1e-3  # well above float noise: the two passes share one seed and one batch


def weight_gradient(ctx: PreflightContext, batch: Any, params: list[torch.Tensor], *,
                    force_graph: bool) -> torch.Tensor | None:
    """The trainable weights' gradient of the first batch's loss (eval mode, seed 0), flat;
    None when the loss is not a differentiable scalar."""
    # cuDNN's RNN kernels refuse a backward in eval mode; the native ones give the same gradients
    with preserved_training_state(ctx), torch.random.fork_rng(devices=[]), torch.backends.cudnn.flags(enabled=False):
        torch.manual_seed(0)
        ctx.model.eval()  # no dropout: both passes compute the same function
        with watched_autograd_grad([], force_graph), ctx.training.plan.autocast():
            output = ctx.compute_loss(ctx.model, batch)
        loss = output[0] if isinstance(output, tuple) else output
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
            return None
        grads = torch.autograd.grad(loss, params, allow_unused=True)  # the real one: the watch has ended
        return torch.cat([(g if g is not None else torch.zeros_like(p)).detach().float().flatten()
                          for g, p in zip(grads, params)])


class DerivativeGraphCheck(Check):
    """DERIVATIVE_WITHOUT_GRAPH: ``autograd.grad`` without ``create_graph`` in the loss."""

    name = "step.derivative_graph"
    stage = Stage.STEP
    codes = ("DERIVATIVE_WITHOUT_GRAPH", "DERIVATIVE_VANISHES", "DERIVATIVE_SUMS_COLUMNS")
    requires = (FIRST_BATCH, FIRST_STEP)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        probe = get_probe(ctx)
        self._vanishing(ctx, probe.derivative_zero, findings)
        if probe.whole_gradients:
            self._whole_gradient(probe.whole_gradients[0], findings)
        calls = probe.derivative_calls  # recorded in the first step: no extra pass when there are none
        findings.data["summary"] = f"{len(calls)} autograd.grad call(s) in the step, {calls.count(False)} without create_graph"
        if all(calls):
            return
        params = [param for param in ctx.model.parameters() if param.requires_grad]
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        try:
            as_written = weight_gradient(ctx, batch, params, force_graph=False)
            forced = weight_gradient(ctx, batch, params, force_graph=True)
        except Exception:
            findings.data["summary"] = "the loss could not be differentiated twice"
            return
        if as_written is None or forced is None:
            return
        scale = float(forced.norm())
        change = float((forced - as_written).norm()) / scale if scale > 0 else 0.0
        findings.data.update(calls_without_graph=calls.count(False), gradient_change=change)
        findings.data["summary"] = (f"{calls.count(False)} autograd.grad call(s) without create_graph; with it the "
                                    f"weights' gradient changes by {change:.0%}")
        field = any(not create and of_field for create, of_field in zip(probe.derivative_calls, probe.derivative_fields))
        if change < (FIELD_CHANGED if field else CHANGED):
            return
        findings.warning(
            "DERIVATIVE_WITHOUT_GRAPH",
            f"the loss uses a derivative taken with torch.autograd.grad without create_graph=True "
            f"({calls.count(False)} call(s) in the step): the derivative comes back as a constant with no graph to "
            f"the weights, so the loss term built from it (a physics-informed residual du/dx - f, a gradient "
            f"penalty) trains nothing; with create_graph=True the weights' gradient on the first batch changes by "
            f"{change:.0%}",
            "Pass create_graph=True to torch.autograd.grad when the derivative is part of the loss (PINN residuals, "
            "WGAN-GP and other gradient penalties, input-gradient regularisers); leave it off only for a derivative "
            "used as data, such as an adversarial perturbation's sign().",
        )

    @staticmethod
    def _whole_gradient(shape: tuple[int, ...], findings: Findings) -> None:
        columns = shape[1]
        findings.warning(
            "DERIVATIVE_SUMS_COLUMNS",
            f"the loss differentiates a whole {shape} gradient again with torch.autograd.grad (grad_outputs of ones, "
            f"or its sum) with respect to the same inputs: that is the derivative of the sum of its {columns} "
            "columns, so each 'second derivative' is a row sum of the Hessian, u_xx + u_tx (a mixed partial added "
            "in), not u_xx. A PINN's heat or wave residual written u_xx = grad(du, x) on du = [u_x, u_t] does this; "
            "the residual then holds a term of the wrong equation and the network fits it",
            "Differentiate one column at a time: u_x = du[:, 0:1]; u_xx = torch.autograd.grad(u_x, x, "
            "torch.ones_like(u_x), create_graph=True)[0][:, 0:1] (and likewise per coordinate for a Laplacian).",
        )

    @staticmethod
    def _vanishing(ctx: PreflightContext, zero: list[bool], findings: Findings) -> None:
        """DERIVATIVE_VANISHES: a later derivative exactly zero at every point while an earlier
        one is not: the second derivative of a piecewise-linear network."""
        vanished = next((i for i in range(1, len(zero)) if zero[i] and not all(zero[:i])), None)
        if vanished is None:
            return
        linear = sorted({type(m).__name__ for m in ctx.model.modules() if isinstance(m, PIECEWISE_LINEAR)})
        named = (f"the model's {', '.join(linear)} activations are piecewise linear, so" if linear else
                 "a piecewise-linear network (ReLU and its kin, also as F.relu) has")
        findings.warning(
            "DERIVATIVE_VANISHES",
            f"the loss takes derivatives with torch.autograd.grad, and call {vanished + 1} of {len(zero)} in the step "
            f"(a derivative of a derivative, such as u_xx from u_x) returned exactly zero at every point while an "
            f"earlier one did not: {named} zero curvature: every second derivative is 0. The PDE residual's "
            "second-order term (a Laplacian, a diffusion or wave term) is then always 0, whatever the weights, so "
            "the physics-informed loss cannot be satisfied and the network only fits the other terms",
            "Use a smooth activation in a network whose loss differentiates it twice: nn.Tanh(), nn.SiLU(), "
            "nn.Softplus() or a sine (torch.sin), not nn.ReLU / LeakyReLU.",
        )


PIECEWISE_LINEAR = (torch.nn.ReLU, torch.nn.LeakyReLU, torch.nn.ReLU6, torch.nn.PReLU, torch.nn.RReLU,
                    torch.nn.Hardtanh)
