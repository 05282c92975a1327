"""Truncation that cuts away the part of each text the labels depend on (``data.truncation_signal``).

``TRUNCATION_DROPS_SIGNAL``: the collate_fn (or a tokenizer call inside it) truncates every
sequence to a fixed ``max_length`` and keeps one end, while what decides the label sits at the
other end (a review's verdict in its last lines, a ticket's resolution code, a document's
conclusion). Shapes, padding and masks are all right; the model is trained on the half of
each text that says nothing about its label.

Read from the data, not the code: raw items (``dataset[i]``) are collated in chunks by the
loader's own ``collate_fn``; each batch row is matched against its item to see which end was
kept; then a bag-of-tokens label probe (``label_signal``: a nearest-neighbour vote and a ridge
probe) is run once on the kept tokens and once on the cut ones. The check fires when the cut
tokens predict the labels clearly better than the tokens the model gets. Truncation of text
whose signal is spread over it, or sits in the kept end, stays quiet.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset

from optimus_preflight.preflight.analyses.label_signal import MIN_SAMPLES, label_signal
from optimus_preflight.preflight.checks.collate_truncation import token_rows
from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.split_labels import BAG_BUCKETS, labels_only
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import leaves

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ITEMS = 768  # raw items read (label_signal needs MIN_SAMPLES)
CHUNK = 32  # items collated together, as a batch would be
BUDGET_S = 3.0
CUT = 0.25  # an item counts as cut when the batch drops at least this share of its tokens ...
CUT_ITEMS = 0.5  # ... and the check runs when at least this share of the items read is cut
MATCH_SLACK = 2  # positions a special token ([CLS], <s>) may shift the kept tokens in the row
GAIN = 0.15  # the cut tokens predict the labels this much better (accuracy) than the kept ones


def item_sequence(item: Any) -> torch.Tensor | None:
    """An item's first 1-D integer tensor (its token ids)."""
    for leaf in leaves(item):
        if isinstance(leaf, torch.Tensor) and leaf.dim() == 1 and not leaf.is_floating_point() \
                and leaf.dtype != torch.bool and leaf.numel() > 1:
            return leaf.detach().long().cpu()
    return None


def kept_end(row: torch.Tensor, sequence: torch.Tensor) -> str | None:
    """Which end of ``sequence`` (longer than the row) the batch row holds: "start", "end" or None."""
    width = row.numel()
    span = width - 2 * MATCH_SLACK
    if span < 4 or sequence.numel() <= width:
        return None
    for offset in range(MATCH_SLACK + 1):
        if torch.equal(row[offset:offset + span], sequence[:span]):
            return "start"
        end = width - offset
        if torch.equal(row[end - span:end], sequence[-span:]):
            return "end"
    return None


def bags(sequences: list[torch.Tensor]) -> torch.Tensor:
    """Hashed bag-of-token shares (N, BAG_BUCKETS), each row summing to 1."""
    out = torch.zeros(len(sequences), BAG_BUCKETS)
    for i, ids in enumerate(sequences):
        out[i].scatter_add_(0, ids.clamp_min(0) % BAG_BUCKETS, torch.ones(ids.numel()))
        out[i] /= max(ids.numel(), 1)
    return out


def _accuracy(signal: Any) -> float:
    return max(signal.neighbour_accuracy, signal.linear_accuracy)


class TruncationSignalCheck(Check):
    """TRUNCATION_DROPS_SIGNAL: the tokens a fixed-length truncation cuts carry the labels."""

    name = "data.truncation_signal"
    stage = Stage.DATA
    codes = ("TRUNCATION_DROPS_SIGNAL",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        dataset = getattr(loader, "dataset", None)
        findings.data["summary"] = "no truncated token sequences"
        first = token_rows(ctx.artifacts.first_batch)
        collate = getattr(loader, "collate_fn", None)
        if first is None or labels_only(ctx.artifacts.first_batch) is None or collate is None or dataset is None \
                or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, dataset, what="len(dataset)")
        if size < MIN_SAMPLES:
            return
        picks = torch.randperm(size, generator=torch.Generator().manual_seed(0))[:ITEMS].tolist()

        def chunk(indices: list[int]) -> tuple[list[Any], Any]:
            items = [dataset[i] for i in indices]
            return items, collate(items)

        kept: list[torch.Tensor] = []
        cut: list[torch.Tensor] = []
        labels: list[torch.Tensor] = []
        ends: dict[str, int] = {}
        started, read = time.perf_counter(), 0
        for at in range(0, len(picks), CHUNK):
            items, batch = guard.call(chunk, picks[at:at + CHUNK], what="dataset[i] and collate_fn")
            rows, chunk_labels = token_rows(batch), labels_only(batch)
            if rows is None or chunk_labels is None or len(rows) != len(items) or len(chunk_labels) != len(items):
                return
            for item, row, label in zip(items, rows.detach().long().cpu(), chunk_labels, strict=True):
                read += 1
                sequence = item_sequence(item)
                if sequence is None:
                    return
                end = kept_end(row, sequence)
                if end is None or (sequence.numel() - row.numel()) < CUT * sequence.numel():
                    continue
                ends[end] = ends.get(end, 0) + 1
                width = row.numel()
                kept.append(sequence[:width] if end == "start" else sequence[-width:])
                cut.append(sequence[width:] if end == "start" else sequence[:-width])
                labels.append(label)
            if at == 0 and len(kept) < CUT_ITEMS * read:
                return  # the first chunk already says most items are not cut
            if time.perf_counter() - started > BUDGET_S:
                break
        if len(kept) < max(MIN_SAMPLES, CUT_ITEMS * read):
            findings.data["summary"] = f"{len(kept)} of {read} items cut by a fixed-length truncation"
            return
        side = max(ends, key=ends.get)
        y = torch.stack(labels)
        kept_signal, cut_signal = label_signal(bags(kept), y), label_signal(bags(cut), y)
        if kept_signal is None or cut_signal is None:
            return
        width = int(first.shape[1])
        findings.data.update(cut_items=len(kept), read=read, kept_end=side, kept_accuracy=round(_accuracy(kept_signal), 3),
                             cut_accuracy=round(_accuracy(cut_signal), 3), majority=round(kept_signal.majority, 3))
        findings.data["summary"] = (f"{len(kept)}/{read} items cut to {width} tokens (keeping the {side}); labels from "
                                    f"kept tokens {_accuracy(kept_signal):.0%}, from cut tokens {_accuracy(cut_signal):.0%}")
        if _accuracy(cut_signal) < _accuracy(kept_signal) + GAIN or cut_signal.unrelated:
            return
        lengths = sorted(int(k.numel() + c.numel()) for k, c in zip(kept, cut, strict=True))
        long = f"all {lengths[0]}" if lengths[0] == lengths[-1] else f"{lengths[0]}-{lengths[-1]}"
        other = "end" if side == "start" else "start"
        keep_other = "ids[-max_length:]" if side == "start" else "ids[:max_length]"
        findings.warning(
            "TRUNCATION_DROPS_SIGNAL",
            f"the collate_fn truncates {len(kept)} of {read} items read ({long} tokens long) to "
            f"{width} tokens and keeps their {side}, but the labels are in the part it cuts: a bag-of-tokens probe "
            f"predicts them {_accuracy(cut_signal):.0%} right from the cut tokens and only {_accuracy(kept_signal):.0%} "
            f"from the kept ones (largest class {kept_signal.majority:.0%}), so the model trains on text that does not "
            "say what the label is",
            f"Keep the {other} of each sequence ({keep_other}; a Hugging Face tokenizer: truncation_side='"
            f"{'left' if side == 'start' else 'right'}'), or raise max_length to cover it "
            "(or split long texts into windows that each keep the label).",
            "data.train",
        )
