"""Sequence pairs whose training sources and targets no longer correspond (``data.pair_lengths``).

A sequence-to-sequence dataset keeps sources and targets in two lists. Sorting one of them
by length for bucketing (``srcs.sort(key=len)``), or filtering or shuffling one on its own,
pairs each source with another example's target. Every shape, dtype and padding stays right.

Read from the lengths: in translation, transliteration, ciphers, summaries of a fixed ratio,
a target's length follows its source's. Where the validation pairs show that (their source
and target lengths correlate) while the training pairs of the same batch layout do not, the
training pairs were taken apart. Tasks whose lengths are unrelated (a question and its
answer) correlate in neither split and stay quiet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_POSITIONS = 4
SAMPLES = 1024
MIN_SAMPLES = 128
BUDGET_S = 2.0
PADDED_ROWS = 0.2  # rows whose last position holds the padding value
ALIGNED = 0.6  # the validation pairs' length correlation
APART = 0.3  # the training pairs' correlation at most


def sequence_lengths(batch: Any) -> tuple[torch.Tensor, ...] | None:
    """The lengths (B,) of each integer (B, T) tensor of a tuple batch, padding being the value
    at the last position of most rows; None for another batch layout."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return None
    lengths = []
    longest = max((leaf.shape[1] for leaf in batch if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2), default=0)
    for leaf in batch:
        if length_vector(leaf, longest):
            lengths.append(leaf.detach().float().cpu())  # CTC's input_lengths, target_lengths: given
            continue
        if not isinstance(leaf, torch.Tensor) or leaf.dim() != 2 or leaf.is_floating_point() \
                or leaf.dtype == torch.bool or leaf.shape[1] < MIN_POSITIONS:
            lengths.append(torch.full((len(leaf) if isinstance(leaf, torch.Tensor) and leaf.dim() else 0,), -1.0))
            continue
        last = leaf[:, -1]
        pad = torch.mode(last).values
        if float((last == pad).float().mean()) < PADDED_ROWS:
            lengths.append(torch.full((len(leaf),), float(leaf.shape[1])))
            continue
        real = leaf != pad
        positions = torch.arange(1, leaf.shape[1] + 1, device=leaf.device)
        lengths.append((real * positions).amax(dim=1).float().cpu())
    return tuple(lengths)


def length_vector(leaf: Any, longest: int) -> bool:
    """A (B,) integer tensor of lengths beside padded sequences: every value from 1 to the
    longest padded axis of the batch (class ids start at 0 and need not fit an axis)."""
    return isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided and leaf.dim() == 1 \
        and not leaf.is_floating_point() \
        and leaf.dtype != torch.bool and leaf.numel() > 1 and longest > 0 and int(leaf.min()) >= 1 \
        and int(leaf.max()) <= longest


def correlation(a: torch.Tensor, b: torch.Tensor) -> float | None:
    # one row per sample on both sides, or no pairing to measure (a seq-first (T, B) tensor's rows are steps)
    if a.shape != b.shape or float(a.std()) == 0 or float(b.std()) == 0:
        return None
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / (a.norm() * b.norm()))


class PairLengthsCheck(Check):
    """PAIRS_MISALIGNED: training source and target lengths unrelated where validation's agree."""

    name = "data.pair_lengths"
    stage = Stage.DATA
    codes = ("PAIRS_MISALIGNED",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        first = sequence_lengths(ctx.artifacts.first_batch)
        sequences = [k for k, lengths in enumerate(first or ()) if float(lengths.std()) > 0 and float(lengths.min()) >= 0]
        if ctx.val_loader is None or len(sequences) < 2:
            findings.data["summary"] = "no two variable-length sequences in a batch, or no validation loader"
            return
        train = self._lengths(ctx, findings, ctx.train_loader, "training")
        val = self._lengths(ctx, findings, ctx.val_loader, "validation")
        if train is None or val is None or len(train) != len(val):
            findings.data["summary"] = "too few samples, or the splits' batches differ"
            return
        for i in sequences:
            for j in sequences:
                if j <= i:
                    continue
                in_val, in_train = correlation(val[i], val[j]), correlation(train[i], train[j])
                if in_val is None or in_train is None:
                    continue
                findings.data.setdefault("length_correlations", []).append(
                    {"tensors": [i, j], "train": round(in_train, 3), "val": round(in_val, 3)})
                if in_val >= ALIGNED and abs(in_train) <= APART and self._speech(ctx, i, j):
                    self._utterances_apart(i, j, in_val, in_train, len(train[i]), findings)
                    return
                if in_val >= ALIGNED and abs(in_train) <= APART:
                    findings.warning(
                        "PAIRS_MISALIGNED",
                        f"the training sources and targets are misaligned: the lengths of batch[{i}] and batch[{j}] "
                        f"correlate at {in_val:.2f} over the validation pairs but at {in_train:.2f} over "
                        f"{len(train[i])} training pairs, so a training source no longer corresponds to its target. "
                        "Usually one side was sorted, filtered or shuffled on its own: the sources sorted by length "
                        "for bucketing (srcs.sort(key=len)) but not the targets, a length filter applied to one list, "
                        "or two lists shuffled with separate permutations",
                        "Sort, filter and shuffle the (source, target) pairs together: pairs = sorted(zip(srcs, tgts), "
                        "key=lambda p: len(p[0])), then unzip; or keep one list of pairs and bucket by index.",
                        "data.train",
                    )
                    return
        findings.data["summary"] = "source and target lengths agree between the splits"

    @staticmethod
    def _speech(ctx: PreflightContext, i: int, j: int) -> bool:
        """Frames (B, T, F) of floats beside a given length vector: utterances and transcripts."""
        batch = ctx.artifacts.first_batch
        longest = max((leaf.shape[1] for leaf in batch if isinstance(leaf, torch.Tensor) and leaf.dim() >= 2), default=0)
        frames = any(isinstance(leaf, torch.Tensor) and leaf.dim() == 3 and leaf.is_floating_point() for leaf in batch)
        return frames and (length_vector(batch[i], longest) or length_vector(batch[j], longest))

    @staticmethod
    def _utterances_apart(i: int, j: int, in_val: float, in_train: float, pairs: int, findings: Findings) -> None:
        findings.warning(
            "PAIRS_MISALIGNED",
            f"the training utterances and the transcripts are misaligned: the lengths of batch[{i}] and batch[{j}] "
            f"correlate at {in_val:.2f} over the validation pairs but at "
            f"{in_train:.2f} over {pairs} training pairs, while a transcript's length follows its utterance's "
            "duration. Usually the features (and their input lengths) were sorted by duration for bucketing while "
            "the transcripts and target lengths were not sorted with them, or one list was filtered or shuffled on "
            "its own: every utterance is trained against another one's text",
            "Reorder the features, transcripts and both length lists with one permutation: order = "
            "torch.argsort(input_lengths); feats, targets, input_lengths, target_lengths = feats[order], "
            "targets[order], input_lengths[order], target_lengths[order] (or sort a list of (features, transcript) "
            "pairs together).",
            "data.train",
        )

    def _lengths(self, ctx: PreflightContext, findings: Findings, loader: Any,
                 which: str) -> list[torch.Tensor] | None:
        parts = read_samples(ctx, self.name, findings, loader, f"{which} lengths for {self.name}",
                             sequence_lengths, SAMPLES, BUDGET_S)
        if not parts or any(len(part) != len(parts[0]) for part in parts):
            return None
        joined = [torch.cat([part[k] for part in parts]) for k in range(len(parts[0]))]
        return joined if len(joined[0]) >= MIN_SAMPLES else None
