"""Under torchrun every rank must reach the same verdict, or the ranks that pass would
wait forever in their first collective for the ranks that stopped.

Each rank runs the checks on its own shard and devices, then one ``all_gather_object``
shares what each found (issues of severity warning and error, crashed checks, and the
hashes of its first batch's samples). Every rank appends the other ranks' issues to its
report under ``distributed.ranks``, so every rank computes the same verdict from the
same issues, and rank 0's ``preflight.json`` lists them all. The same exchange finds
ranks that read the same samples (DP2: an IterableDataset not sharded by rank).
In a single process nothing is exchanged and the report is unchanged.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from optimus_preflight.preflight.framework.execution import CheckResult
from optimus_preflight.preflight.framework.issues import CHECK_CRASHED, CheckStatus, Issue, Severity, Stage
from optimus_preflight.preflight.framework.report import PreflightReport

CHECK_NAME = "distributed.ranks"
DUPLICATE_FRACTION = 0.5


def rank_payload(rank: int, report: PreflightReport, sample_hashes: list[str]) -> dict[str, Any]:
    return {
        "rank": rank,
        "issues": [
            (check.name, issue.code, issue.severity.value, issue.message, issue.fix, issue.config_key)
            for check, issue in report.issues()
            if issue.severity != Severity.INFO and check.name != CHECK_NAME
        ],
        "crashed": [check.name for check in report.checks if check.status == CheckStatus.CRASHED],
        "sample_hashes": list(sample_hashes),
    }


def duplicated_rank_pairs(hashes_by_rank: dict[int, list[str]]) -> list[tuple[int, int, float]]:
    """(rank a, rank b, share of samples in common) for ranks whose first batches overlap."""
    pairs = []
    ranks = sorted(rank for rank, hashes in hashes_by_rank.items() if hashes)
    for i, a in enumerate(ranks):
        for b in ranks[i + 1 :]:
            first, second = set(hashes_by_rank[a]), set(hashes_by_rank[b])
            shared = len(first & second) / min(len(first), len(second))
            if shared >= DUPLICATE_FRACTION:
                pairs.append((a, b, shared))
    return pairs


def merge_rank_payloads(local_rank: int, payloads: list[dict[str, Any]]) -> CheckResult | None:
    """The ``distributed.ranks`` result for this rank, or None for a single process."""
    if len(payloads) < 2:
        return None
    issues: list[Issue] = []
    for payload in sorted(payloads, key=lambda p: p["rank"]):
        rank = payload["rank"]
        if rank == local_rank:
            continue
        for check, code, severity, message, fix, key in payload["issues"]:
            issues.append(Issue(code, Severity(severity), f"rank {rank}, {check}: {message}", fix, key))
        for check in payload["crashed"]:
            issues.append(Issue(CHECK_CRASHED, Severity.WARNING, f"rank {rank}: check {check} crashed",
                                f"See rank {rank}'s log for the exception."))
    pairs = duplicated_rank_pairs({p["rank"]: p["sample_hashes"] for p in payloads})
    if pairs:
        listed = ", ".join(f"{a}&{b} ({100 * share:.0f}%)" for a, b, share in pairs[:4])
        issues.append(Issue(
            "DP2", Severity.ERROR,
            f"ranks read the same samples in their first batch (ranks {listed}): the data is not sharded by rank, "
            "so more GPUs do not mean more data",
            "Map-style data: use a DistributedSampler. IterableDataset: skip items in __iter__ so each rank keeps "
            "index % world_size == rank (combined with the worker split).",
            "data.train",
        ))
    severities = {issue.severity for issue in issues}
    status = (CheckStatus.ERROR if Severity.ERROR in severities
              else CheckStatus.WARNING if Severity.WARNING in severities else CheckStatus.PASSED)
    return CheckResult(CHECK_NAME, Stage.STEP, status, 0.0, issues,
                       {"world_size": len(payloads), "summary": f"{len(payloads)} ranks agree on the verdict"})


def exchange(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's payload, in rank order; just this one without an initialised group."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return [payload]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, payload)
    return gathered


def agree_on_verdict(report: PreflightReport, rank: int, sample_hashes: list[str]) -> PreflightReport:
    """Add the other ranks' findings to ``report`` (in place) so all ranks share one verdict."""
    merged = merge_rank_payloads(rank, exchange(rank_payload(rank, report, sample_hashes)))
    if merged is not None:
        report.checks.append(merged)
    return report
