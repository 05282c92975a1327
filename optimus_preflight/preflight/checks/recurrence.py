"""A hand-unrolled recurrence that detaches its state at every step (``step.recurrence``).

``for t in range(T): h = cell(x[:, t], h.detach())`` keeps the graph small, but the
gradient then stops after one step: the cell only ever learns one-step dependencies, and
anything the label owes to early inputs cannot be learned. (Truncated backpropagation
detaches between batches or every k steps, not at every step.)

One train-mode forward with gradients on the first batch, with hooks on every
``nn.RNNCell``/``nn.GRUCell``/``nn.LSTMCell``: a call whose state argument is the previous
call's output, detached (same storage, no grad), is the mistake.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_DETACHED_CALLS = 2


class RecurrenceCheck(Check):
    """DETACHED_RECURRENCE: a recurrent cell fed its own previous state detached, step after step."""

    name = "step.recurrence"
    stage = Stage.STEP
    codes = ("DETACHED_RECURRENCE",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        cells = {m: name for name, m in ctx.model.named_modules() if isinstance(m, nn.RNNCellBase)}
        if not cells:
            findings.data["summary"] = "no recurrent cell"
            return
        outputs: dict[nn.Module, set[int]] = {}
        detached: dict[nn.Module, int] = {}
        calls: dict[nn.Module, int] = {}

        def before(module: nn.Module, args: tuple) -> None:
            calls[module] = calls.get(module, 0) + 1
            earlier = outputs.get(module, set())
            for state in [leaf for arg in args[1:] for leaf in leaves(arg) if isinstance(leaf, torch.Tensor)]:
                if not state.requires_grad and state.data_ptr() in earlier:
                    detached[module] = detached.get(module, 0) + 1
                    break

        def after(module: nn.Module, args: tuple, output: Any) -> None:
            outputs.setdefault(module, set()).update(
                leaf.data_ptr() for leaf in leaves(output) if isinstance(leaf, torch.Tensor) and leaf.requires_grad)

        handles = [m.register_forward_pre_hook(before) for m in cells] + [m.register_forward_hook(after) for m in cells]
        try:
            with preserved_training_state(ctx), torch.enable_grad():
                ctx.model.train()
                with ctx.training.plan.autocast():
                    ctx.compute_loss(ctx.model, move_to_device(ctx.artifacts.first_batch, ctx.device))
        except Exception:
            findings.data["summary"] = "the forward could not be observed"
            return
        finally:
            for handle in handles:
                handle.remove()
        findings.data["summary"] = f"{len(calls)} recurrent cell(s), {sum(calls.values())} call(s)"
        for module, count in detached.items():
            if count >= MIN_DETACHED_CALLS and count >= calls[module] // 2:
                findings.error(
                    "DETACHED_RECURRENCE",
                    f"the {type(module).__name__} '{cells[module]}' receives its own previous state detached in "
                    f"{count} of its {calls[module]} calls: the gradient stops after one step of the recurrence, so "
                    "it only learns one-step dependencies and nothing the label owes to earlier inputs",
                    "Pass the state itself: h = cell(x[:, t], h). Detach between batches (or every k steps for "
                    "truncated backpropagation through time), not at every step.",
                )
                return
