"""A forward that carries state from one batch into the next (``step.stateful_forward``).

``STATE_CARRIED_ACROSS_BATCHES``: a recurrent model that stores its last hidden state on
``self`` (``self.hidden = h.detach()``) and starts the next batch from it: the "stateful
LSTM" of Keras tutorials, or a hidden state initialised once in ``__init__``. That is
truncated backpropagation through time, and it is only right when each batch continues the
sequences of the previous one. With a shuffling loader every batch starts from the final
state of unrelated samples: noise the model cannot learn to ignore, and predictions that
depend on which batch came before.

Read from a model with a recurrent layer: two eval-mode forwards of the same batch with the RNG reseeded
before each (so dropout and sampling layers repeat themselves); a stateless model gives the
same outputs twice. Only judged when the training loader does not read its samples in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.utils.data import SequentialSampler

from optimus_preflight.preflight.analyses.eval_forward import model_outputs
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

RECURRENT = (torch.nn.RNNBase, torch.nn.RNNCellBase)
TOLERANCE = 1e-4  # of the outputs' largest magnitude: a change far above float noise


def _seeded_outputs(ctx: PreflightContext) -> list[torch.Tensor] | None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return model_outputs(ctx, ctx.artifacts.first_batch)


class StatefulForwardCheck(Check):
    """STATE_CARRIED_ACROSS_BATCHES: the same batch twice gives other outputs."""

    name = "step.stateful_forward"
    stage = Stage.STEP
    codes = ("STATE_CARRIED_ACROSS_BATCHES",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        findings.data["summary"] = "the same batch gives the same outputs"
        sampler = getattr(ctx.train_loader, "sampler", None)
        if isinstance(sampler, SequentialSampler):
            findings.data["summary"] = "batches read in order: state carried across them may be meant"
            return
        if not any(isinstance(m, RECURRENT) for m in ctx.model.modules()):
            # A memory bank updated in forward (MoCo's queue of keys) changes outputs by design.
            findings.data["summary"] = "no recurrent layer"
            return
        first, second = _seeded_outputs(ctx), _seeded_outputs(ctx)
        if not first or not second or first[0].shape != second[0].shape or not first[0].is_floating_point():
            return
        a, b = first[0].float(), second[0].float()
        if not bool(torch.isfinite(a).all()) or not bool(torch.isfinite(b).all()):
            return
        scale = float(a.abs().max())
        change = float((a - b).abs().max())
        findings.data.update(max_change=change, output_scale=scale)
        if scale == 0 or change <= TOLERANCE * scale:
            return
        holders = [name for name, module in ctx.model.named_modules()
                   for attr, value in vars(module).items()
                   if not attr.startswith("_") and (isinstance(value, torch.Tensor)
                                                    or (isinstance(value, (tuple, list)) and value
                                                        and all(isinstance(v, torch.Tensor) for v in value)))]
        where = f" (tensors kept on {', '.join(repr(h or 'the model') for h in holders[:3])})" if holders else ""
        findings.warning(
            "STATE_CARRIED_ACROSS_BATCHES",
            f"the model gives the same batch other outputs on a second call (eval mode, the RNG reseeded before "
            f"each; largest change {change:.3g} on outputs of size {scale:.3g}): its forward keeps state from one call "
            f"to the next{where}, typically a recurrent hidden state stored on self and used as the next batch's "
            "initial state. With a shuffling loader each batch then starts from the final state of unrelated samples, "
            "so the model learns from noise and its predictions depend on which batch came before",
            "Start every batch from a fresh state: call the RNN without an initial state (or reset self.hidden = None "
            "at the start of forward); carry the state across batches only for truncated BPTT over batches that "
            "continue each other's sequences (shuffle=False), detaching it between batches.",
            "model",
        )
