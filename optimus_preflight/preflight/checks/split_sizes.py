"""How much data a step and the run get, read from the loaders (``data.split_sizes``).

- ``SPLIT_TRAIN_SMALLER``: the training set holds fewer than half the samples of the
  validation set. A split fraction given for the wrong side does it: scikit-learn's
  ``train_test_split(X, y, test_size=0.8)`` with 0.8 meant as the training share trains on
  a fifth of the data and validates on the rest.
- ``BATCHING_DISABLED``: a map-style dataset read by ``DataLoader(batch_size=None)``, which
  turns automatic batching off: every "batch" is one sample, without a batch dimension
  (a 0-dim target), so each step trains on a single example with the noise of one. A
  config's ``None`` meant as "the default" does it; a dataset that returns whole batches
  itself (its items share a leading batch dimension), or holds one item that is the whole
  batch (a full graph with its node index), is what ``batch_size=None`` is for.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import IterableDataset

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.checks.val_loader import length_of
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.training.batches import leaves

SMALLER = 0.5  # the training set under this share of the validation set's size


def _samples(loader: Any) -> int | None:
    dataset = getattr(loader, "dataset", None)
    return length_of(dataset) if dataset is not None and not isinstance(dataset, IterableDataset) else None


ROUND_SHARES = {"5%": 0.05, "10%": 0.1, "15%": 0.15, "20%": 0.2, "25%": 0.25, "30%": 0.3, "a third": 1 / 3, "40%": 0.4}


def split_fraction(train: int, val: int) -> str | None:
    """The round share the training set is of both (within one sample, as a split rounds), if
    it is one: what ``train_test_split(test_size=0.8)`` meant the other way round leaves."""
    total = train + val
    return next((name for name, share in ROUND_SHARES.items() if abs(train - share * total) <= 1), None)


def _unbatched(batch: Any) -> bool:
    """A sample, not a batch: some tensor is 0-dim, or no size is common to every tensor (a
    batch's tensors share the batch size, though not always as their first axis: a BPTT
    batchifier yields (B, T) inputs beside (T, B) targets)."""
    tensors = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor)]
    if not tensors:
        return False
    if any(t.dim() == 0 for t in tensors):
        return True
    return not set.intersection(*(set(t.shape) for t in tensors))


class SplitSizesCheck(Check):
    """SPLIT_TRAIN_SMALLER, BATCHING_DISABLED."""

    name = "data.split_sizes"
    stage = Stage.DATA
    codes = ("SPLIT_TRAIN_SMALLER", "BATCHING_DISABLED")
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        train, val = _samples(ctx.train_loader), _samples(ctx.val_loader) if ctx.val_loader is not None else None
        findings.data["summary"] = f"{train} training and {val} validation samples"
        if train and val and train < SMALLER * val and (fraction := split_fraction(train, val)) is None:
            findings.info(
                "SPLIT_TRAIN_SMALLER",
                f"the training set holds {train} samples and the validation set {val} ({train / (train + val):.0%} "
                "for training). No split fraction makes these sizes, so the validation set is probably larger on "
                "purpose (few-shot training, ranking candidates scored against each held-out item); a fraction given "
                "for the wrong side would make them a round share",
                "Give the held-out share to test_size (test_size=0.2 keeps 80% for training) if the split was meant "
                "the other way round.",
            )
        elif train and val and train < SMALLER * val:
            findings.warning(
                "SPLIT_TRAIN_SMALLER",
                f"the training set holds {train} samples and the validation set {val}: training sees only "
                f"{fraction} of the data, exactly. A split fraction given for the wrong side does this: "
                "train_test_split(X, y, test_size=0.8) with 0.8 meant as the training share keeps a fifth for "
                "training and validates on the rest",
                "Give the held-out share to test_size (test_size=0.2 keeps 80% for training), or pass train_size= "
                "when you mean the training share.",
            )
        loader = ctx.train_loader
        dataset = getattr(loader, "dataset", None)
        if getattr(loader, "batch_size", 0) is None and getattr(loader, "batch_sampler", 0) is None \
                and dataset is not None and not isinstance(dataset, IterableDataset) \
                and _samples(loader) != 1 and _unbatched(ctx.artifacts.first_batch):
            # (One item read without batching is a whole batch built by hand: a full graph, the
            # (x, adjacency, labels, node index) of transductive node classification.)
            findings.warning(
                "BATCHING_DISABLED",
                "the training loader was built with batch_size=None, which turns automatic batching off: each "
                "'batch' is a single sample without a batch dimension (the first one's tensors are "
                + ", ".join(str(tuple(t.shape)) for t in leaves(ctx.artifacts.first_batch) if isinstance(t, torch.Tensor))
                + "), so every step trains on one example, with the noise of one, and the model sees unbatched input",
                "Pass a batch size (DataLoader(dataset, batch_size=64, shuffle=True)); batch_size=None is only for a "
                "dataset whose items are already whole batches. A config's null meant as 'the default' does this.",
            )
