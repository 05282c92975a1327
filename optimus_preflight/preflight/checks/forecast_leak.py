"""A next-step forecaster that sees the step it forecasts (``step.forecast_leak``).

A many-to-many forecaster trained with ``loss(model(series[:, :-1]), series[:, 1:])``
predicts, at every position t, the value at t + 1, which is also its input at t + 1. A
model that reads any later input (a Conv1d with symmetric 'same' padding, a bidirectional
RNN, attention without a causal mask) copies it: the loss falls below the noise floor and
the model cannot forecast. The token-level twin (a language model) is ``step.target_leak``.

Read from the step: the model's first floating input (B, L) (or (B, L, 1), (B, 1, L)) and a
regression target whose value at t is that input at t + 1; then the inputs from the middle
on are perturbed, and the predictions before the middle must not move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.analyses.loss_spy import REGRESSION_CRITERIA
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_LENGTH = 8
SHIFT_MATCH = 0.99  # of the targets equal to the next input
MOVED = 1e-4  # of the predictions' scale


def as_rows(tensor: torch.Tensor) -> torch.Tensor | None:
    """(B, L) view of a (B, L), (B, L, 1) or (B, 1, L) float tensor."""
    if tensor.dim() == 3 and tensor.shape[2] == 1:
        return tensor[..., 0]
    if tensor.dim() == 3 and tensor.shape[1] == 1:
        return tensor[:, 0]
    return tensor if tensor.dim() == 2 else None


def next_step_objective(inputs: torch.Tensor, target: torch.Tensor) -> bool:
    """target[:, t] == inputs[:, t + 1] for (nearly) every t that has a next input (pure)."""
    x, y = as_rows(inputs), as_rows(target)
    if x is None or y is None or x.shape[0] != y.shape[0] or x.shape[1] < MIN_LENGTH:
        return False
    reach = min(y.shape[1], x.shape[1] - 1)
    if reach < MIN_LENGTH - 1:
        return False
    return float((y[:, :reach] == x[:, 1:reach + 1]).float().mean()) >= SHIFT_MATCH


class _Seen(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.target: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.target is None and getattr(func, "__name__", "") in REGRESSION_CRITERIA and len(args) > 1 \
                and isinstance(args[1], torch.Tensor):
            self.target = args[1]
        return func(*args, **kwargs)


class ForecastLeakCheck(Check):
    """FORECAST_LEAK: a next-step forecaster whose prediction at t reads the input at t + 1."""

    name = "step.forecast_leak"
    stage = Stage.STEP
    codes = ("FORECAST_LEAK",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        calls: list[tuple[tuple, dict]] = []

        def on_call(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not calls:
                calls.append((args, kwargs))

        seen = _Seen()
        handle = ctx.model.register_forward_pre_hook(on_call, with_kwargs=True)
        try:
            with seen:
                eval_forward(ctx, ctx.artifacts.first_batch)
        except Exception:
            findings.data["summary"] = "the step could not be observed"
            return
        finally:
            handle.remove()
        if not calls or seen.target is None or not calls[0][0] or not isinstance(calls[0][0][0], torch.Tensor):
            findings.data["summary"] = "no regression objective on a sequence input"
            return
        args, kwargs = calls[0]
        inputs = args[0]
        if not inputs.is_floating_point() or not next_step_objective(inputs, seen.target):
            findings.data["summary"] = "not a next-step objective"
            return
        moved = self._reads_ahead(ctx, args, kwargs)
        findings.data["summary"] = "next-step objective; " + ("predictions read later inputs" if moved else "causal")
        if moved:
            findings.error(
                "FORECAST_LEAK",
                "the model is trained to predict the next value at every position (its target at t is its own input "
                "at t + 1), but its prediction at t moves when later inputs change: it sees the value it is asked "
                "to forecast and learns to copy it, so the loss falls below the noise floor and the model cannot "
                "forecast. Usually symmetric 'same' padding in Conv1d (padding=k // 2 reads k // 2 steps ahead), a "
                "bidirectional RNN, or attention without a causal mask",
                "Make every layer causal: pad convolutions on the left only (F.pad(x, (k - 1, 0)) then padding=0), "
                "use a unidirectional RNN, or pass a causal mask to attention.",
            )

    @staticmethod
    def _reads_ahead(ctx: PreflightContext, args: tuple, kwargs: dict) -> bool:
        inputs = args[0]
        rows = as_rows(inputs)
        middle = rows.shape[1] // 2
        changed = inputs.clone()
        changed_rows = as_rows(changed)
        changed_rows[:, middle:] += rows.std().clamp_min(1e-3) * torch.randn_like(rows[:, middle:])
        with preserved_training_state(ctx), torch.no_grad():
            ctx.model.eval()
            before = ctx.model(*args, **kwargs)
            after = ctx.model(changed, *args[1:], **kwargs)
        if not isinstance(before, torch.Tensor) or before.shape != after.shape:
            return False
        first, second = as_rows(before), as_rows(after)
        if first is None or first.shape[1] < middle:
            return False
        scale = float(first.abs().max().clamp_min(1e-12))
        return bool(((first[:, :middle - 1] - second[:, :middle - 1]).abs() > MOVED * scale).any())
