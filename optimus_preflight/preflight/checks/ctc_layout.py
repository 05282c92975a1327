"""Log-probabilities whose batch axis is not where CTC reads it (``step.ctc_layout``).

``F.ctc_loss`` and ``nn.CTCLoss`` read ``log_probs`` as ``(T, N, C)``: time first, the batch
on dim 1. Acoustic models and Keras habits produce ``(N, T, C)``. When the batch size differs
from the number of frames, the lengths' sizes disagree and torch raises; when they are equal
(24 utterances of 24 frames, a padded batch of fixed length) every shape matches, and CTC
aligns each transcript with one time step of every utterance of the batch.

Shapes cannot tell the two apart; the samples can. The first batch goes through the loss
twice in eval mode, the second time with sample 0 replaced by sample 1 (as
``step.sample_mixing`` probes the model). The log-probabilities CTC received move only in
the slice of sample 0: ``log_probs[:, 0]`` when time-major, ``log_probs[0]`` when batch-first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from optimus_preflight.preflight.analyses.eval_forward import eval_forward
from optimus_preflight.preflight.checks.sample_mixing import probe_batches
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES = 4
SPREAD = 0.5  # of the other axis's positions that moved with sample 0: a whole utterance, not a frame


class CtcInputs(TorchFunctionMode):
    """Copies of the ``log_probs`` of every ``ctc_loss`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.log_probs: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "ctc_loss":
            log_probs = args[0] if args else kwargs.get("log_probs")
            if isinstance(log_probs, torch.Tensor) and log_probs.dim() == 3:
                self.log_probs.append(log_probs.detach().float().cpu().clone())
        return func(*args, **kwargs)


def ctc_log_probs(ctx: PreflightContext, batch: Any) -> list[torch.Tensor] | None:
    watch = CtcInputs()
    try:
        with watch:
            eval_forward(ctx, batch)
    except Exception:
        return None
    return watch.log_probs


def moved(a: torch.Tensor, b: torch.Tensor, axis: int) -> list[int]:
    """Positions along ``axis`` of (D0, D1, C) log-probabilities where anything changed."""
    other = 1 - axis
    changed = (a - b).abs().amax(dim=(other, 2)) > 1e-6 * (1 + a.abs().amax())
    return [int(i) for i in torch.nonzero(changed).flatten()]


def batch_first(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Sample 0's change lies in ``log_probs[0]`` across most of dim 1, which CTC reads as the
    batch (pure): (N, T, C) log-probabilities where (T, N, C) is read."""
    if before.shape != after.shape or before.shape[0] != before.shape[1]:
        return False
    along_first, along_second = moved(before, after, 0), moved(before, after, 1)
    return along_first == [0] and len(along_second) > SPREAD * before.shape[1]


class CtcLayoutCheck(Check):
    """CTC_BATCH_FIRST: batch-first log-probabilities given to a CTC loss that reads (T, N, C)."""

    name = "step.ctc_layout"
    stage = Stage.STEP
    codes = ("CTC_BATCH_FIRST",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        size = getattr(ctx.train_loader, "batch_size", None) or batch_size_of(batch)
        if not size or size < MIN_SAMPLES:
            findings.data["summary"] = "batch too small to probe"
            return
        # the whole batch: a cut one would no longer match the frames when the layout is wrong
        probes = probe_batches(batch, size, size)
        seen = [ctc_log_probs(ctx, probe) for probe in probes]
        if not seen[0] or not seen[1] or len(seen[0]) != len(seen[1]):
            findings.data["summary"] = "no CTC loss in the step"
            return
        before, after = seen[0][0], seen[1][0]
        if not batch_first(before, after):
            findings.data["summary"] = f"CTC log-probabilities {tuple(before.shape)}, the batch on dim 1"
            return
        frames = before.shape[1]
        findings.data["summary"] = "CTC log-probabilities batch-first"
        findings.error(
            "CTC_BATCH_FIRST",
            f"the CTC loss gets batch-first (N, T, C) log-probabilities of shape {tuple(before.shape)}, while "
            "F.ctc_loss / nn.CTCLoss read (T, N, C), time-major, with the batch on dim 1: changing sample 0 of the "
            f"batch moved only log_probs[0] and {frames} positions of dim 1. Because the batch size equals the number "
            f"of frames ({frames}) nothing raises, and CTC aligns each transcript with one time step of every "
            "utterance in the batch, so time and batch are swapped and the model cannot learn the transcripts",
            "Transpose the log-probabilities to time-major before the loss: ctc(log_probs.transpose(0, 1), targets, "
            "input_lengths, target_lengths) (log_softmax over the class axis, -1, first).",
        )
