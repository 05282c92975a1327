"""A recurrent layer run over right padding, read out after it (``step.padding_readout``).

``out, (h, c) = lstm(embed(padded))`` followed by ``out[:, -1]`` or ``h[-1]`` reads the
state after the last position of the batch. In a right-padded batch that is padding for
every shorter sequence: the RNN has stepped through a run of pad vectors since the last real
token, so the prediction comes from a state that has been washed out by the padding (and
changes with how much of it the batch needs). Packing the batch, gathering
``out[arange(B), lengths - 1]``, or padding on the left reads the state at the last real token.

The probe reads what the read-out really depends on: one eval-mode forward of the first
samples with gradients, the input of every ``nn.RNN``/``nn.LSTM``/``nn.GRU`` call replaced
by a copy that requires grad. Padding is a run at the end of a row of one vector repeated,
the same vector in several rows (the embedding of the pad id, or zeros). The gradient of a
random projection of the model's output per position says where the read-out looks: when,
in most padded rows, the last position (padding) gets far more of it than any real token,
the output is read after the padding. A packed sequence is no tensor and is not probed; a
read-out at ``lengths - 1``, a masked or max pooling, or left padding give the pad positions
little or no gradient and stay quiet; a plain mean over all positions spreads it evenly.
Only a per-sample prediction, a (B, C) or (B,) output, is a read-out: an encoder-decoder
whose encoder runs over padding hands its last state to a decoder that emits a sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from optimus_preflight.preflight.checks.sample_mixing import PROBE_SAMPLES, probe_batches
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, leaves, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_PAD_RUN = 2  # pad positions at the end of a row for it to count as padded
# Rows judged: a pad run this long. The gradient at the last real token decays by about 1.5-2x
# per pad step, so two or three pad steps cannot show the read-out's position yet.
JUDGED_RUN = 4
MIN_PADDED_ROWS = 2
# The last position's gradient over the largest of any real token's: an LSTM or GRU read after
# 8-27 pad steps gives 4e1-7e5; a mean over every position of an RNN's output gives < 1; a
# transformer's last position (attention sees every token directly) needs no RNN and is not probed.
DOMINANCE = 10.0
ROWS_SHARE = 0.75  # of the padded rows, where the last position dominates


@dataclass
class RecurrentInput:
    name: str
    module: nn.RNNBase
    value: torch.Tensor  # what the layer received, requires grad
    batch_first: bool

    def rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (shaped as ``value``) as (B, T, ...)."""
        return tensor if self.batch_first else tensor.transpose(0, 1)


@dataclass
class Readout:
    padded_rows: int
    dominated_rows: int
    median_ratio: float  # the last position's gradient over the largest real token's
    pad_share: float  # of the output's gradient, on the padding (median over padded rows)


def trailing_padding(sequences: torch.Tensor) -> torch.Tensor | None:
    """(B, T) mask of the padding at the end of each row of a (B, T, F) batch: the run of
    positions equal to the row's last vector, where that vector is the one most rows end with
    and ends runs of two or more in several rows; None when there is no such padding."""
    if sequences.dim() != 3 or sequences.shape[1] < MIN_PAD_RUN + 1:
        return None
    last = sequences[:, -1:, :]
    same = (sequences == last).all(dim=-1)  # (B, T)
    run = same.flip(1).long().cumprod(dim=1).flip(1).bool()
    lengths = run.sum(dim=1)
    padded = lengths >= MIN_PAD_RUN
    if int(padded.sum()) < MIN_PADDED_ROWS:
        return None
    # One vector pads every row: the pad id's embedding, or zeros. Real sequences that end by
    # repeating a vector end with different ones.
    vectors = last[padded, 0, :]
    common = (vectors == vectors[0]).all(dim=-1)
    if int(common.sum()) < MIN_PADDED_ROWS or float(common.float().mean()) < 0.5:
        return None
    pad_vector = vectors[0]
    is_pad_row = (last[:, 0, :] == pad_vector).all(dim=-1) & padded
    mask = run & is_pad_row.unsqueeze(1)
    # A row that is padding throughout has no real token to compare with.
    mask[mask.all(dim=1)] = False
    return mask if int((mask.sum(dim=1) >= MIN_PAD_RUN).sum()) >= MIN_PADDED_ROWS else None


def readout_of(gradient_norms: torch.Tensor, padding: torch.Tensor) -> Readout | None:
    """Where the read-out looks, from (B, T) per-position gradient norms and the padding mask."""
    ratios, shares = [], []
    for norms, pad in zip(gradient_norms, padding, strict=True):
        if int(pad.sum()) < JUDGED_RUN or bool(pad.all()):
            continue
        real = norms[~pad]
        total = float(norms.sum())
        if total == 0.0:
            continue
        ratios.append(float(norms[-1]) / max(float(real.max()), 1e-30))
        shares.append(float(norms[pad].sum()) / total)
    if len(ratios) < MIN_PADDED_ROWS:
        return None
    dominated = sum(ratio >= DOMINANCE for ratio in ratios)
    return Readout(len(ratios), dominated, float(torch.tensor(ratios).median()), float(torch.tensor(shares).median()))


class PaddingReadoutCheck(Check):
    """READOUT_AFTER_PADDING: an RNN over right-padded batches, read at the last position."""

    name = "step.padding_readout"
    stage = Stage.STEP
    codes = ("READOUT_AFTER_PADDING",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        recurrent = {m: name for name, m in ctx.model.named_modules() if isinstance(m, nn.RNNBase)}
        if not recurrent:
            findings.data["summary"] = "no recurrent layer"
            return
        batch = ctx.artifacts.first_batch
        size = getattr(ctx.train_loader, "batch_size", None) or batch_size_of(batch)
        if not size:
            findings.data["summary"] = "no batch size"
            return
        probe, _ = probe_batches(batch, size, min(size, PROBE_SAMPLES))
        traced = self._trace(ctx, probe, recurrent)
        if traced is None:
            findings.data["summary"] = "no padded sequence reached a recurrent layer as a tensor"
            return
        seen, readout = traced
        findings.data.update(layer=seen.name, padded_rows=readout.padded_rows, dominated_rows=readout.dominated_rows,
                             median_ratio=round(readout.median_ratio, 3), pad_share=round(readout.pad_share, 4))
        findings.data["summary"] = (f"{seen.name}: the last position gets {readout.median_ratio:.3g}x the gradient of "
                                    f"the largest real token (median over {readout.padded_rows} padded rows)")
        if readout.dominated_rows < ROWS_SHARE * readout.padded_rows:
            return
        kind = type(seen.module).__name__
        both = " (for a bidirectional one, torch.cat([h_n[-2], h_n[-1]], dim=1))" if seen.module.bidirectional else ""
        findings.warning(
            "READOUT_AFTER_PADDING",
            f"nn.{kind} '{seen.name}' runs over right-padded sequences as a plain tensor, and the model's output is read "
            f"after the padding: in {readout.dominated_rows} of {readout.padded_rows} padded rows the last position, "
            f"which is padding, gets {readout.median_ratio:,.0f}x (median) the gradient of any real token, and "
            f"{readout.pad_share:.0%} of the output's gradient goes to pad positions. out[:, -1] and h_n of an unpacked "
            "batch are the state after a run of pad steps, which washes out the real tokens (the first ones most) "
            "and changes with how much padding each batch needs",
            f"Pack the batch so the {kind} stops at each sequence's end: "
            "packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False), "
            f"then read h_n[-1]{both}; or read out[torch.arange(B), lengths - 1]; or pad on the left.",
        )

    @staticmethod
    def _trace(ctx: PreflightContext, batch: Any, recurrent: dict[nn.Module, str]) -> tuple[RecurrentInput, Readout] | None:
        seen: list[RecurrentInput] = []

        def before(module: nn.Module, args: tuple) -> tuple | None:
            value = args[0] if args else None
            if not isinstance(value, torch.Tensor) or value.dim() != 3 or not value.is_floating_point():
                return None  # a PackedSequence stops at each sequence's end: nothing to probe
            watched = value.detach().clone().requires_grad_(True)
            seen.append(RecurrentInput(recurrent[module], module, watched, bool(module.batch_first)))  # type: ignore[arg-type]
            return (watched, *args[1:])

        outputs: list[Any] = []
        top = ctx.model.register_forward_hook(lambda module, args, output: outputs.append(output) if not outputs else None)
        handles = [m.register_forward_pre_hook(before) for m in recurrent]
        try:
            # cuDNN's RNN kernels refuse a backward in eval mode; the native ones give the same gradients.
            with preserved_training_state(ctx), torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
                ctx.model.eval()
                with ctx.training.plan.autocast():
                    ctx.compute_loss(ctx.model, move_to_device(batch, ctx.device))
                candidates = [(entry, mask) for entry in seen
                              if (mask := trailing_padding(entry.rows(entry.value.detach()))) is not None]
                # A per-sample prediction, (B, C) or (B,): a sequence output (a seq2seq decoder's (B, T, V)
                # logits, a tagger's) reads the encoder's state to start from, not as the answer.
                scores = [t for t in leaves(outputs[:1]) if isinstance(t, torch.Tensor) and t.requires_grad
                          and t.is_floating_point() and t.dim() <= 2]
                if not candidates or not scores:
                    return None
                generator = torch.Generator().manual_seed(0)
                projection = sum((t.float() * torch.randn(t.shape, generator=generator).to(t.device)).sum()
                                 for t in scores)
                grads = torch.autograd.grad(projection, [entry.value for entry, _ in candidates], allow_unused=True)
        except Exception:
            return None
        finally:
            top.remove()
            for handle in handles:
                handle.remove()
        for (entry, mask), grad in zip(candidates, grads, strict=True):
            if grad is None:
                continue
            readout = readout_of(entry.rows(grad).float().norm(dim=-1).cpu(), mask.cpu())
            if readout is not None:
                return entry, readout
        return None
