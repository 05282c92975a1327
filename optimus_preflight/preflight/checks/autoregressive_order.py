"""An autoregressive density model whose outputs see the values they predict
(``step.autoregressive_order``).

MADE, PixelCNN and other autoregressive models predict each dimension from the ones before it:
output d may depend on inputs 1..d-1 only. A mask built with ``>=`` where ``>`` was meant (the
output layer's degrees), a type-B mask in the first layer, or a causal convolution trimmed at
the wrong end lets output d read input d itself: the training loss falls fast by copying, and
the model is no density at all (sampling one dimension at a time goes wrong).

Read from the model, not the code: for two samples of the first batch, which inputs each output
depends on (the gradient of the output with respect to the input). When the loss compares the
model's output with its own input (a density of the data) and the dependencies between
different dimensions form an order (no two dimensions depend on each other) while a quarter or
more of the outputs depend on their own input (a strict order has none), the diagonal leaks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward, model_call
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MAX_DIMS = 128  # one backward pass per output dimension
SAMPLES = 2
SELF_SHARE = 0.25  # of the outputs depend on their own input (a strict order has none; dead units hide some)
CRITERIA = {"binary_cross_entropy_with_logits", "binary_cross_entropy", "mse_loss", "l1_loss", "cross_entropy",
            "nll_loss", "gaussian_nll_loss"}


class FirstTarget(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.target: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.target is None and getattr(func, "__name__", "") in CRITERIA:
            target = args[1] if len(args) > 1 else kwargs.get("target")
            if isinstance(target, torch.Tensor):
                self.target = target.detach()
        return func(*args, **kwargs)


def dependencies(model: Any, x: torch.Tensor) -> torch.Tensor | None:
    """(D, D) bool: output d (summed over any trailing axis) depends on input j, for one sample."""
    x = x.detach().clone().requires_grad_(True)
    out = model(x)
    if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.shape[:2] != x.shape[:2]:
        return None
    rows = []
    for d in range(x.shape[1]):
        (grad,) = torch.autograd.grad(out[:, d].sum(), x, retain_graph=True, allow_unused=True)
        rows.append(torch.zeros(x.shape[1], dtype=torch.bool) if grad is None else (grad[0].abs() > 0).cpu())
    return torch.stack(rows)


def leaks_own_value(dep: torch.Tensor) -> bool:
    """Dependencies between different dimensions that form an order (no pair depends both ways;
    at least one per two dimensions) while many outputs also depend on their own input."""
    dims = dep.shape[0]
    off = dep & ~torch.eye(dims, dtype=torch.bool)
    if int(off.sum()) < dims // 2 or bool((off & off.T).any()):
        return False
    return float(dep.diagonal().float().mean()) >= SELF_SHARE


class AutoregressiveOrderCheck(Check):
    """AUTOREGRESSIVE_SEES_ITSELF: an autoregressive density model whose output d reads input d."""

    name = "step.autoregressive_order"
    stage = Stage.STEP
    codes = ("AUTOREGRESSIVE_SEES_ITSELF",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        call = model_call(ctx, ctx.artifacts.first_batch)
        inputs = call[0] if call is not None else []
        if len(inputs) != 1 or not inputs[0].is_floating_point() or inputs[0].dim() != 2 \
                or not 2 <= inputs[0].shape[1] <= MAX_DIMS:
            findings.data["summary"] = "no single (B, D) input of a density model"
            return
        x = inputs[0]
        watch = FirstTarget()
        try:
            with watch:
                eval_forward(ctx, ctx.artifacts.first_batch)
        except Exception:
            findings.data["summary"] = "the loss could not be observed"
            return
        target = watch.target
        if target is None or target.shape[:2] != x.shape or not torch.equal(target.float().cpu(), x.float().cpu()):
            findings.data["summary"] = "the loss does not score the model's own input"
            return
        with preserved_training_state(ctx), torch.enable_grad():
            ctx.model.eval()
            try:
                found = [dependencies(ctx.model, x[i:i + 1]) for i in range(min(SAMPLES, len(x)))]
            except Exception:
                findings.data["summary"] = "the dependencies could not be measured"
                return
        if any(dep is None for dep in found):
            findings.data["summary"] = "the output is not one value (or row) per input dimension"
            return
        dep = torch.stack(found).any(0)
        own = float(dep.diagonal().float().mean())
        findings.data["summary"] = f"{own:.0%} of the outputs depend on their own input"
        if not leaks_own_value(dep):
            return
        findings.warning(
            "AUTOREGRESSIVE_SEES_ITSELF",
            f"the model is autoregressive (its {dep.shape[0]} dimensions depend on each other in one order) but "
            f"{own:.0%} of its outputs also read the very input they predict: output d depends on input d. A mask "
            "built with >= where > was meant (MADE's output mask, m_out[d] > m_hidden), a type-B mask in the first "
            "layer of a PixelCNN, or a causal convolution trimmed at the wrong end does this; the loss falls by "
            "copying and the model is no density (sampling dimension by dimension fails)",
            "Make the output connections strict: out_mask = m_in[:, None] > m_hidden[None, :] (an output sees only "
            "earlier dimensions); in a PixelCNN use a type-A mask in the first layer; trim a causal convolution's "
            "padding from the end (x[..., :-pad]).",
        )
