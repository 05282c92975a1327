"""DP3: under torchrun, every rank must read the same number of batches per epoch.

DDP runs one gradient all-reduce per step on every rank. With an IterableDataset
sharded by rank (nothing pads the shards, unlike DistributedSampler) or a custom
sampler, one rank can run out of batches first: in an epoch loop it leaves the epoch
while the others wait in the all-reduce of their next step until the collective times
out (gloo's timeout, NCCL's watchdog), or ranks silently train on different step counts.

Each rank counts its batches: ``len(loader)`` for map-style data, else by reading one
epoch under the data guard, within ``COUNT_MAX_BATCHES`` and ``COUNT_BUDGET_S`` (past
either the count is a lower bound). The counts are exchanged through the rendezvous
store (``Peers.gather``, bounded by ``trainer.dist_timeout_s``); every rank posts one,
even a rank whose count failed, so no rank waits for a check another skipped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optimus_preflight.preflight.checks.batch_checks import is_map_style
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, SkipCheck, Stage, StopCheck
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.distributed import peers

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

COUNT_MAX_BATCHES = 10_000
COUNT_BUDGET_S = 5.0
UNKNOWN = -1


def encode_count(count: int | None, complete: bool) -> int:
    """One int per rank for the exchange: n batches (a whole epoch), -(n + 2) for at least
    n (the count stopped at the cap), -1 for not counted."""
    if count is None:
        return UNKNOWN
    return count if complete else -(count + 2)


def decode_count(value: int) -> tuple[int | None, bool]:
    if value == UNKNOWN:
        return None, False
    return (value, True) if value >= 0 else (-value - 2, False)


@dataclass(frozen=True)
class ShardVerdict:
    uneven: bool
    verified: bool
    counts: str  # "rank 0: 13, rank 1: >= 12"


def compare_counts(values: list[int]) -> ShardVerdict:
    """Uneven when two whole-epoch counts differ, or a capped rank already read more than
    another rank's whole epoch; verified only when every rank counted a whole epoch."""
    decoded = [decode_count(value) for value in values]
    exact = [count for count, complete in decoded if complete]
    at_least = [count for count, complete in decoded if count is not None and not complete]
    shown = ", ".join(f"rank {rank}: " + ("not counted" if count is None else f"{'' if complete else '>= '}{count}")
                      for rank, (count, complete) in enumerate(decoded))
    uneven = len(set(exact)) > 1 or bool(exact and at_least and max(at_least) > min(exact))
    return ShardVerdict(uneven, len(exact) == len(values), shown)


def count_batches(loader: Any, guard: DataGuard) -> tuple[int, bool]:
    """(batches in one epoch, whether that is the whole epoch) for this rank, reading at
    most COUNT_MAX_BATCHES batches for at most COUNT_BUDGET_S."""
    if is_map_style(getattr(loader, "dataset", None)):
        try:  # the sampler decides: its __len__ (user code for a custom one) is the count
            return guard.call(len, loader, what="len(loader)"), True
        except TypeError:
            pass
    count, started = 0, time.perf_counter()
    with guard.batches(loader, purpose="the per-rank batch count") as batches:
        for _ in batches:
            count += 1
            if count >= COUNT_MAX_BATCHES or time.perf_counter() - started > COUNT_BUDGET_S:
                return count, False
    return count, True


EVEN_FIX = ("Give every rank the same number of batches per epoch: split the stream so each rank gets the same number "
            "of samples (drop the remainder, e.g. keep the first world_size * (n // world_size) items before sharding, "
            "or pad the short shards by cycling samples) and set drop_last=True on the DataLoader; or run the epoch "
            "loop inside `with torch.distributed.algorithms.join.Join([model]):` (DDP's join), which shadows the "
            "all-reduces of the ranks that finish first.")


class RankBatchesCheck(Check):
    """DP3: the ranks' batches per epoch, compared (under torchrun only)."""

    name = "data.rank_batches"
    stage = Stage.DATA
    codes = ("DP3",)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        group = peers()
        if ctx.training.dist.world_size < 2 or group is None:
            findings.data["summary"] = ("not applicable (a single process)" if ctx.training.dist.world_size < 2
                                        else "not run (no process group to compare the ranks' counts over)")
            return
        if type(ctx.train_loader).__module__.split(".")[0] == "accelerate":
            # accelerate pads every rank's shard to the same length (even_batches,
            # IterableDatasetShard), and its dispatcher broadcasts per batch: a count that
            # stops at a time budget on one rank only would leave the other waiting.
            findings.data["summary"] = "not applicable (accelerate gives every rank the same batches)"
            return
        # Every rank posts its count, even one that could not count: the others wait for it.
        value, interrupted = UNKNOWN, None
        try:
            with preserved_data_state(ctx):
                count, complete = count_batches(ctx.train_loader, DataGuard(ctx, self.name, findings))
            value = encode_count(count, complete)
        except (SkipCheck, StopCheck) as stop:  # the data code hung, here or in an earlier check
            interrupted = stop
        except Exception as error:  # a broken batch: data.first_batch or the run itself reports it
            findings.data["count_error"] = f"{type(error).__name__}: {str(error)[:200]}"
        timeout_s = float(ctx.cfg.trainer.dist_timeout_s)
        values = group.gather(value, during="the preflight's per-rank batch count",
                              bound=lambda: (timeout_s, "trainer.dist_timeout_s"))
        if interrupted is not None:
            raise interrupted
        verdict = compare_counts(values)
        findings.data.update(batches_per_rank=verdict.counts, verified=verdict.verified)
        findings.data["summary"] = f"batches per epoch: {verdict.counts}"
        if verdict.uneven:
            findings.error(
                "DP3",
                f"the ranks read different numbers of batches per epoch ({verdict.counts}): DDP needs the same number "
                "of steps on every rank. In an epoch loop (`for batch in loader`) the rank that runs out first leaves "
                "the epoch while the others wait in the gradient all-reduce of their next step until the collective "
                "times out (a hang); in a loop that counts steps across epochs the ranks drift apart at every epoch "
                "end, and the shorter shards are trained on more often",
                EVEN_FIX, None, code_fix=EVEN_FIX)
        elif not verdict.verified:
            findings.info(
                "DP3",
                f"batches per epoch not verified equal across ranks ({verdict.counts}): counting stops after "
                f"{COUNT_MAX_BATCHES} batches or {COUNT_BUDGET_S:g} s. If the shards can differ in length, "
                "an epoch loop hangs at the end of the shortest one.",
                EVEN_FIX)
