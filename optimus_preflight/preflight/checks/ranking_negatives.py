"""Negatives of a ranking loss that are positives (``data.ranking_negatives``).

``NEGATIVES_ARE_POSITIVES``: batches of ``(user, positive item, negative item)`` triples
(BPR, triplet ranking) whose negative items are, for a large share of the triples, items
the same user has as a positive in other triples. A rejection loop written the wrong way
round (``while j not in seen[u]`` for ``while j in seen[u]``) draws every negative from the
user's own items, and the ranking loss then separates two liked items: nothing to learn.
Sampling negatives uniformly without rejection hits a user's positives only as often as
the catalogue is that user's, a few percent.

Read from up to 4096 training triples: the share of ``(user, negative)`` pairs that occur
as a ``(user, positive)`` pair among the triples read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from optimus_preflight.preflight.checks.data_checks import FIRST_BATCH
from optimus_preflight.preflight.data_access.guard import read_samples
from optimus_preflight.preflight.framework import Check, Findings, Stage

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

TRIPLES = 4096
SCAN_BUDGET_S = 2.0
POSITIVE_SHARE = 0.2  # of the (user, negative) pairs found among the (user, positive) pairs
MIN_HITS = 10


def id_triples(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(users, positives, negatives) of a batch of three integer (B,) id tensors, the last two
    over one id range (items); None otherwise."""
    if not isinstance(batch, (list, tuple)) or len(batch) != 3:
        return None
    if not all(isinstance(t, torch.Tensor) and t.dim() == 1 and not t.is_floating_point() and t.dtype != torch.bool
               for t in batch):
        return None
    users, positives, negatives = (t.detach().long().cpu() for t in batch)
    if len({len(users), len(positives), len(negatives)}) != 1 or len(users) < 2:
        return None
    if bool((positives < 0).any()) or bool((negatives < 0).any()):
        return None
    return users, positives, negatives


def negatives_among_positives(users: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor) -> tuple[int, int]:
    """(triples whose (user, negative) occurs as some triple's (user, positive), triples)."""
    liked = set(zip(users.tolist(), positives.tolist(), strict=True))
    hits = sum((user, item) in liked for user, item in zip(users.tolist(), negatives.tolist(), strict=True))
    return hits, len(users)


class RankingNegativesCheck(Check):
    """NEGATIVES_ARE_POSITIVES: a ranking triple's negative is one of the user's positives."""

    name = "data.ranking_negatives"
    stage = Stage.DATA
    codes = ("NEGATIVES_ARE_POSITIVES",)
    requires = (FIRST_BATCH,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if id_triples(ctx.artifacts.first_batch) is None:
            findings.data["summary"] = "not a batch of (user, positive, negative) ids"
            return
        parts = read_samples(ctx, self.name, findings, ctx.train_loader, f"training triples for {self.name}",
                             id_triples, TRIPLES, SCAN_BUDGET_S)
        if not parts:
            return
        users, positives, negatives = (torch.cat([p[i] for p in parts])[:TRIPLES] for i in range(3))
        hits, total = negatives_among_positives(users, positives, negatives)
        findings.data.update(negatives_among_positives=hits, triples=total)
        findings.data["summary"] = f"{hits} of {total} negatives are a positive of their user"
        if hits < MIN_HITS or hits < POSITIVE_SHARE * total:
            return
        findings.warning(
            "NEGATIVES_ARE_POSITIVES",
            f"{hits} of {total} training triples read ({hits / total:.0%}) have a negative item that the same user has "
            "as a positive in another triple: the negatives are drawn from the user's own items, so the ranking loss "
            "separates two items the user liked and has nothing to learn. A rejection loop written the wrong way "
            "round does this: while j not in seen[u] (keep drawing until j IS one of the user's items) where "
            "while j in seen[u] was meant",
            "Reject the user's own items when sampling a negative: j = randrange(n_items); while j in seen[u]: "
            "j = randrange(n_items).",
        )
