"""Checks on how samples become batches: ragged samples under default collate, a
size-1 final batch under BatchNorm, and the sampling order across epochs and ranks."""

from __future__ import annotations

import math
from typing import Any

from torch import nn
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate

from optimus_preflight.preflight.batches import leaf_shapes
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.snapshot import preserved_data_state

COLLATE_SCAN_SAMPLES = 32


def is_map_style(dataset: Any) -> bool:
    return not isinstance(dataset, IterableDataset) and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")


def shape_groups(dataset: Any, indices: list[int]) -> dict[tuple, list[int]]:
    """Sample indices grouped by the shapes of their tensors."""
    groups: dict[tuple, list[int]] = {}
    for index in indices:
        groups.setdefault(leaf_shapes(dataset[index]), []).append(index)
    return groups


def describe_groups(groups: dict[tuple, list[int]], limit: int = 4) -> str:
    return "; ".join(f"{len(members)} like sample {members[0]}: {list(shape)}"
                     for shape, members in list(groups.items())[:limit])


class CollateCheck(Check):
    """DP4: samples whose shapes differ break default collate when they meet in a batch."""

    name = "data.collate"
    stage = Stage.DATA

    def run(self, ctx: Any, findings: Findings) -> None:
        loader = ctx.train_loader
        dataset = loader.dataset
        if not (is_map_style(dataset) and loader.collate_fn is default_collate and type(loader.batch_sampler) is BatchSampler
                and (loader.batch_size or 1) > 1):
            findings.data["summary"] = "not applicable (custom collate/batch sampler, iterable data or batch size 1)"
            return
        size = len(dataset)
        indices = sorted({round(i * (size - 1) / max(COLLATE_SCAN_SAMPLES - 1, 1)) for i in range(min(COLLATE_SCAN_SAMPLES, size))})
        with preserved_data_state(ctx):
            groups = shape_groups(dataset, indices)
        findings.data.update(samples_scanned=len(indices), distinct_shapes=len(groups))
        findings.data["summary"] = f"{len(indices)} samples scanned, {len(groups)} shape signature(s)"
        if len(groups) > 1:
            findings.error(
                "DP4",
                f"samples have {len(groups)} different shapes ({describe_groups(groups)}): default collate raises 'stack expects "
                "each tensor to be equal size' as soon as two of them share a batch",
                "Pass a collate_fn that pads (torch.nn.utils.rnn.pad_sequence plus a mask, and mask the loss), or "
                "crop/resize samples to one shape in the dataset.",
                "data.train",
            )


class FinalBatchCheck(Check):
    """DP8: a final batch of one sample under BatchNorm in training mode."""

    name = "data.final_batch"
    stage = Stage.DATA

    def run(self, ctx: Any, findings: Findings) -> None:
        loader = ctx.train_loader
        norms = [m for m in ctx.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        batch_size = loader.batch_size
        findings.data["summary"] = "no BatchNorm in the model" if not norms else "drop_last=true"
        if not norms or loader.drop_last or not batch_size or batch_size < 2 or loader.sampler is None:
            return
        try:
            samples = len(loader.sampler)
        except TypeError:
            return
        last = samples % batch_size
        findings.data.update(samples_per_epoch=samples, last_batch_size=last or batch_size)
        findings.data["summary"] = f"last batch of an epoch: {last or batch_size} sample(s)"
        if last != 1:
            return
        per_epoch = math.ceil(samples / batch_size)
        planned = ctx.cfg.trainer.max_steps * ctx.cfg.trainer.accumulation_steps
        crashes = any(isinstance(m, nn.BatchNorm1d) for m in norms)
        message = (f"{samples} samples per epoch in batches of {batch_size} leave a final batch of 1 sample, and the "
                   f"model has BatchNorm: " + ("BatchNorm1d raises 'Expected more than 1 value per channel when "
                   "training'" if crashes else "its batch statistics over one sample are noise"))
        fix = "Set data.drop_last=true for the training loader (or use GroupNorm/LayerNorm)."
        if planned < per_epoch:
            findings.info("DP8", message + f"; this run ends before the epoch's last batch ({planned} of {per_epoch})",
                          fix, "data.drop_last")
        elif crashes:
            findings.error("DP8", message + f", at the end of the first epoch (batch {per_epoch})", fix, "data.drop_last")
        else:
            findings.warning("DP8", message, fix, "data.drop_last")


class SamplingCheck(Check):
    """DP14: an unshuffled training loader; a sampler that ignores the ranks."""

    name = "data.sampling"
    stage = Stage.DATA

    def run(self, ctx: Any, findings: Findings) -> None:
        loader = ctx.train_loader
        sampler = loader.sampler
        world = ctx.training.dist.world_size
        if isinstance(loader.dataset, IterableDataset):
            findings.data["summary"] = "IterableDataset: the dataset decides the order"
            return
        findings.data["sampler"] = type(sampler).__name__
        findings.data["summary"] = f"{type(sampler).__name__}"
        shuffled = not isinstance(sampler, SequentialSampler) and getattr(sampler, "shuffle", True)
        if not shuffled:
            findings.warning(
                "DP14",
                f"the training loader is not shuffled ({type(sampler).__name__}): every epoch sees the data in "
                "the same order, and sorted data gives correlated batches",
                "Set data.shuffle=true (or pass a shuffling sampler).",
                "data.shuffle",
            )
        if not hasattr(sampler, "set_start"):
            # BatchStream then fast-forwards a resumed run by reading the consumed batches,
            # and a sampler drawing its order from the global RNG gives another order.
            unseeded = isinstance(sampler, RandomSampler) and sampler.generator is None and loader.generator is None
            findings.add(
                "warning" if unseeded else "info",
                "RESUME_ORDER",
                f"the {type(sampler).__name__} cannot seek: a resumed run re-reads the batches it already consumed "
                "in the interrupted epoch to skip them"
                + (", and without a seeded generator the epoch's order after a resume differs, so samples are "
                   "repeated or skipped" if unseeded else ""),
                "Build the loader with optimus_preflight.data.build_loader (a ResumableSampler), or pass a "
                "seeded generator (DataLoader(..., generator=torch.Generator().manual_seed(seed))).",
                "data.train",
            )
        replicas = getattr(sampler, "num_replicas", getattr(sampler, "world_size", None))
        rank = getattr(sampler, "rank", None)
        if world > 1 and replicas != world:
            findings.error(
                "DP2",
                f"{world} ranks but the {type(sampler).__name__} is not sharded across them"
                + (f" (it splits {replicas} ways)" if replicas else "")
                + ": every rank trains on the same samples",
                "Use a DistributedSampler(dataset, num_replicas=world_size, rank=rank) with shuffle=False on the "
                "DataLoader, and call set_epoch(epoch) each epoch.",
                "data.train",
            )
        elif world > 1 and rank is not None and rank != ctx.training.dist.rank:
            findings.error("DP2", f"the sampler reads shard {rank} but this process is rank {ctx.training.dist.rank}",
                           "Build the sampler with rank=torch.distributed.get_rank().", "data.train")
