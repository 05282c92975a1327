"""What is really in each sample's input (``data.input_content``).

``INPUT_MOSTLY_PADDING``: every sample of the first batch is a few real values followed by
zeros, 95% of the input or more. A waveform read with the wrong axis (``wav[0]`` of a
``(frames, channels)`` array is the first frame, two numbers, which ``F.pad`` then pads to
the clip length), a truncation to the wrong length, a crop of the wrong dimension: the
model sees silence. Padded batches of real, varied lengths keep far more than 5%.

``PAIR_SEGMENTS_IDENTICAL``: a sentence-pair batch (``input_ids`` with ``token_type_ids``)
whose two segments are the same tokens in most samples. ``encode(premise, premise)`` for
``encode(premise, hypothesis)``: the second sentence never reaches the model, and a task
about how the two relate cannot be learned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

REAL_SHARE = 0.05  # of the positions: at most this many real values before the zeros
MIN_LENGTH = 256  # values per sample before "mostly padding" means anything
SAME_SEGMENTS = 0.8  # share of the pairs whose two segments are identical


def real_prefix(values: torch.Tensor) -> torch.Tensor:
    """Per sample (rows of a (B, L) tensor), the length of the prefix before the trailing zeros."""
    nonzero = values != 0
    positions = torch.arange(1, values.shape[1] + 1, device=values.device)
    return (nonzero * positions).amax(dim=1)


def identical_segments(ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor | None) -> float | None:
    """The share of rows whose segment-0 and segment-1 tokens (special first/last tokens of each
    segment dropped) are the same sequence; None without two segments."""
    same = rows = 0
    for row in range(ids.shape[0]):
        valid = mask[row].bool() if mask is not None else torch.ones_like(ids[row], dtype=torch.bool)
        first = ids[row][valid & (types[row] == 0)]
        second = ids[row][valid & (types[row] == 1)]
        if len(first) < 3 or len(second) < 2:
            continue
        rows += 1
        # segment 0 is [CLS] a [SEP], segment 1 is b [SEP]
        same += int(torch.equal(first[1:-1], second[:-1]))
    return same / rows if rows else None


class InputContentCheck(Check):
    """INPUT_MOSTLY_PADDING, PAIR_SEGMENTS_IDENTICAL: inputs that hold almost nothing."""

    name = "data.input_content"
    stage = Stage.DATA
    codes = ("INPUT_MOSTLY_PADDING", "PAIR_SEGMENTS_IDENTICAL")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        findings.data["summary"] = "inputs hold content"
        if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), torch.Tensor) \
                and isinstance(batch.get("token_type_ids"), torch.Tensor):
            mask = batch.get("attention_mask") if isinstance(batch.get("attention_mask"), torch.Tensor) else None
            share = identical_segments(batch["input_ids"], batch["token_type_ids"], mask)
            if share is not None and share >= SAME_SEGMENTS:
                findings.warning(
                    "PAIR_SEGMENTS_IDENTICAL",
                    f"in {share:.0%} of the first batch's sentence pairs the second segment (token_type_ids 1) is the "
                    "same tokens as the first: the pair was encoded from one text twice (tokenizer(premise, premise) "
                    "where tokenizer(premise, hypothesis) was meant), so the second sentence never reaches the model "
                    "and a label about how the two relate cannot be learned",
                    "Encode each example from both of its texts: tokenizer(example['premise'], example['hypothesis']); "
                    "decode one batch row (tokenizer.decode(input_ids[0])) to check.",
                )
                return
        first = next((leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()
                      and leaf.dim() >= 2 and leaf[0].numel() >= MIN_LENGTH), None)
        if first is None or first.shape[0] < 2:
            return
        values = first.detach().reshape(first.shape[0], -1)
        prefix = real_prefix(values)
        longest = int(prefix.max())
        if longest == 0 or longest > REAL_SHARE * values.shape[1]:
            return
        findings.data["real_values"] = longest
        findings.warning(
            "INPUT_MOSTLY_PADDING",
            f"every sample of the first batch's input {tuple(first.shape)} is at most {longest} real values followed "
            f"by zeros ({1 - longest / values.shape[1]:.1%} of it is padding): the model sees almost nothing. A "
            "waveform read along the wrong axis does this: wav[0] of a (frames, channels) array, as soundfile returns "
            "it, is the first frame (one value per channel), which F.pad then pads to the clip length; a truncation "
            "or crop of the wrong dimension too",
            "Take the channel along its own axis (wav[:, 0] for (frames, channels); torchaudio.load gives (channels, "
            "frames)) and print one input's non-zero length.",
        )
