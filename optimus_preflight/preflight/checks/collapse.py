"""A self-supervised similarity loss that collapses the representation (``step.collapse``).

``REPRESENTATION_COLLAPSE``: SimSiam, BYOL and their kin pull two views' embeddings
together with no negative pairs; what keeps every input from mapping to one vector is the
stop-gradient on one side (``z.detach()``, or a momentum encoder under ``no_grad``). Without
it, both sides move towards each other, the constant embedding solves the loss exactly
(cosine 1), and training finds it within a few hundred steps: the loss reaches its bound
while the representation says nothing.

Measured, not guessed from the code: only when the first step's loss compared two tensors
that both carry gradients (``cosine_similarity``, or a regression criterion whose target
requires grad), a copy of the model trains ``STEPS`` steps on the first batch with a fresh
optimizer of the same settings, and the spread of the compared embeddings across the batch
(unit-normalised, per feature) is read at the first and the last step. With the
stop-gradient it holds; collapsing, it falls several-fold.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.analyses.trial_steps import make_runner
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.checks.step_smoke import copy_for_training
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

STEPS = 30
COLLAPSE = 2.5  # the spread falls this many times over STEPS steps


class ComparedEmbeddings(TorchFunctionMode):
    """Keeps the first argument of the first similarity call of each step."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.first: torch.Tensor | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.first is None and getattr(func, "__name__", "") == self.name and args \
                and isinstance(args[0], torch.Tensor):
            self.first = args[0].detach()
        return func(*args, **(kwargs or {}))


def spread(embeddings: torch.Tensor) -> float:
    """How far the unit-normalised embeddings of a batch differ: 1 - the length of their
    mean (0 when every sample is one vector, near 1 when they point every way)."""
    flat = F.normalize(embeddings.float().reshape(embeddings.shape[0], -1), dim=-1)
    return float(1 - flat.mean(0).norm())


class CollapseCheck(Check):
    """REPRESENTATION_COLLAPSE: a similarity between two branches with gradients drives every embedding to one."""

    name = "step.collapse"
    stage = Stage.STEP
    codes = ("REPRESENTATION_COLLAPSE",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        similarity = get_probe(ctx).symmetric_similarity
        if similarity is None:
            findings.data["summary"] = "no similarity between two tensors that both carry gradients"
            return
        spreads: list[float] = []
        losses: list[float] = []
        try:
            with preserved_training_state(ctx):
                model, optimizer = copy_for_training(ctx.model, ctx.optimizer)
                model.train()
                runner = make_runner(ctx, model, optimizer, scaler=copy.deepcopy(ctx.training.scaler),
                                     accumulation_steps=1, clip=False)
                for _ in range(STEPS):
                    watch = ComparedEmbeddings(similarity)
                    with watch:
                        result = runner.run(iter([(ctx.artifacts.first_batch, True)]))
                    if watch.first is None or watch.first.shape[0] < 2:
                        return
                    spreads.append(spread(watch.first))
                    losses.append(float(result.loss))
                del model, optimizer
        except Exception as error:  # the copy cannot train alone (a loss holding the original model)
            findings.data["summary"] = f"not measured: {type(error).__name__}"
            return
        first, last = spreads[0], spreads[-1]
        findings.data.update(similarity=similarity, spread_first=round(first, 5), spread_last=round(last, 5),
                             loss_first=round(losses[0], 5), loss_last=round(losses[-1], 5))
        findings.data["summary"] = f"{similarity}: embedding spread {first:.3g} -> {last:.3g} in {STEPS} steps"
        if not (first > 0 and last * COLLAPSE <= first and losses[-1] < losses[0]):
            return
        findings.warning(
            "REPRESENTATION_COLLAPSE",
            f"the loss compares two embeddings that both carry gradients ({similarity}, no stop-gradient on either "
            f"side), and the representation collapses: trained {STEPS} steps on one batch, a copy's embeddings went "
            f"from a spread of {first:.3g} to {last:.3g} across the batch ({first / last:.1f}x less) while the loss fell "
            f"from {losses[0]:.4g} to {losses[-1]:.4g}. With no negative pairs, the constant embedding solves the "
            "loss: both branches move towards each other until every input maps to one vector (SimSiam and BYOL "
            "rely on the stop-gradient to avoid it)",
            "Stop the gradient on the target side: loss = -(cos(p1, z2.detach()) + cos(p2, z1.detach())) / 2 (or a "
            "momentum encoder run under torch.no_grad()); or use a loss with negatives (NT-Xent / InfoNCE).",
        )
