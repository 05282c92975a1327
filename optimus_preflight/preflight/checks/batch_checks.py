"""Checks on how samples become batches: ragged samples under default collate, a
size-1 final batch under BatchNorm, and the sampling order across epochs and ranks."""

from __future__ import annotations

import math
import operator
import time
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler
from torch.utils.data._utils.collate import default_collate

from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.data_access.samples import leaf_shapes
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_data_state
from optimus_preflight.training.epoch_replay import (
    can_skip_by_index,
    capture_order,
    custom_samplers,
    first_index_batches,
)

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

COLLATE_SCAN_SAMPLES = 32
# A scan of a slow (not hung) dataset stops reading after this long, with what it has.
COLLATE_SCAN_BUDGET_S = 2.0


def is_map_style(dataset: Any) -> bool:
    return not isinstance(dataset, IterableDataset) and hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")


def shape_groups(dataset: Any, indices: list[int], guard: DataGuard, budget_s: float = math.inf) -> dict[tuple, list[int]]:
    """Sample indices grouped by the shapes of their tensors. Each sample is read under
    the guard's timeout (``dataset[i]`` is user code, in this process); the scan stops
    early once it has taken ``budget_s``."""
    groups: dict[tuple, list[int]] = {}
    started = time.perf_counter()
    for index in indices:
        if groups and time.perf_counter() - started > budget_s:
            break
        sample = guard.call(operator.getitem, dataset, index, what=f"dataset[{index}]")
        groups.setdefault(leaf_shapes(sample), []).append(index)
    return groups


def describe_groups(groups: dict[tuple, list[int]], limit: int = 4) -> str:
    return "; ".join(f"{len(members)} like sample {members[0]}: {list(shape)}"
                     for shape, members in list(groups.items())[:limit])


def not_a_dataloader(loader: Any, findings: Findings) -> bool:
    """run_preflight takes any iterable of batches (a list, a generator): the checks that
    read a DataLoader's dataset, sampler or batch size say so and step aside."""
    if isinstance(loader, DataLoader):
        return False
    findings.data["summary"] = f"not a torch DataLoader ({type(loader).__name__}): nothing to read"
    return True


class CollateCheck(Check):
    """DP4: samples whose shapes differ break default collate when they meet in a batch."""

    name = "data.collate"
    stage = Stage.DATA
    codes = ("DP4",)
    requires = ("data.first_batch",)  # a loader that cannot yield one batch has nothing to scan

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        if not_a_dataloader(loader, findings):
            return
        dataset = loader.dataset
        if not (is_map_style(dataset) and loader.collate_fn is default_collate and type(loader.batch_sampler) is BatchSampler
                and (loader.batch_size or 1) > 1):
            findings.data["summary"] = "not applicable (custom collate/batch sampler, iterable data or batch size 1)"
            return
        guard = DataGuard(ctx, self.name, findings)
        size = guard.call(len, dataset, what="len(dataset)")
        indices = sorted({round(i * (size - 1) / max(COLLATE_SCAN_SAMPLES - 1, 1)) for i in range(min(COLLATE_SCAN_SAMPLES, size))})
        with preserved_data_state(ctx):
            groups = shape_groups(dataset, indices, guard, COLLATE_SCAN_BUDGET_S)
        scanned = sum(len(members) for members in groups.values())
        findings.data.update(samples_scanned=scanned, distinct_shapes=len(groups))
        findings.data["summary"] = f"{scanned} samples scanned, {len(groups)} shape signature(s)"
        if len(groups) > 1:
            pad = "Pass a collate_fn that pads (torch.nn.utils.rnn.pad_sequence plus a mask, and mask the loss)"
            crop = "or crop/resize samples to one shape in the dataset."
            findings.error(
                "DP4",
                f"samples have {len(groups)} different shapes ({describe_groups(groups)}): default collate raises 'stack expects "
                "each tensor to be equal size' as soon as two of them share a batch",
                f"{pad}, {crop}",
                "data.train",
                code_fix=f"{pad} to the DataLoader your build_dataloaders() returns, {crop}",
            )


BN_MIN_BATCH = 8  # samples per batch below which BatchNorm's batch statistics are noise


class FinalBatchCheck(Check):
    """DP8: a final batch of one sample under BatchNorm in training mode; BN_SMALL_BATCH: every
    batch too small for BatchNorm's statistics."""

    name = "data.final_batch"
    stage = Stage.DATA
    codes = ("DP8", "BN_SMALL_BATCH")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        if not_a_dataloader(loader, findings):
            return
        norms = [m for m in ctx.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                 and (m.training or m.track_running_stats is False)]
        batch_size = loader.batch_size
        if norms and batch_size and batch_size < BN_MIN_BATCH:
            steps = ctx.cfg.trainer.accumulation_steps
            accumulated = (f" (trainer.accumulation_steps={steps} makes the optimizer's batch {batch_size * steps}, "
                           "but BatchNorm still sees each micro-batch alone)") if steps > 1 else ""
            # One sample: BatchNorm over a map or a sequence normalises it by its own statistics
            # (BatchNorm1d on (1, C) raises instead, and the first step reports that).
            statistics = ("each sample by its own mean and variance over its positions, an InstanceNorm: whatever "
                          "sets one sample apart from another in level or scale (often what the classes differ by) "
                          "is erased before the model sees it" if batch_size == 1 else
                          f"each batch by its own mean and variance, which over {batch_size} samples are noise (with "
                          "2, every feature becomes +-1)")
            findings.warning(
                "BN_SMALL_BATCH",
                f"the model has BatchNorm and the training batches hold {batch_size} sample"
                f"{'s' if batch_size > 1 else ''}{accumulated}: BatchNorm normalises {statistics}, and the running "
                "statistics used in eval mode do not match what training normalised with",
                "Use larger micro-batches (16 or more) with fewer accumulation steps, or replace BatchNorm with "
                "GroupNorm/LayerNorm, which do not depend on the batch.",
                "data.batch_size",
            )
            return
        findings.data["summary"] = "no BatchNorm in the model" if not norms else "drop_last=true"
        if not norms or loader.drop_last or not batch_size or batch_size < 2 or loader.sampler is None:
            return
        try:  # a custom sampler's __len__ is user code
            samples = DataGuard(ctx, self.name, findings).call(len, loader.sampler, what="len(sampler)")
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
        code_fix = "Pass drop_last=True to the training DataLoader your build_dataloaders() returns (or use GroupNorm/LayerNorm)."
        if planned < per_epoch:
            findings.info("DP8", message + f"; this run ends before the epoch's last batch ({planned} of {per_epoch})",
                          fix, "data.drop_last", code_fix=code_fix)
        elif crashes:
            findings.error("DP8", message + f", at the end of the first epoch (batch {per_epoch})", fix, "data.drop_last",
                           code_fix=code_fix)
        else:
            findings.warning("DP8", message, fix, "data.drop_last", code_fix=code_fix)


class SamplingCheck(Check):
    """DP14: an unshuffled training loader; a sampler that ignores the ranks."""

    name = "data.sampling"
    stage = Stage.DATA
    codes = ("DP2", "DP14", "RESUME_ORDER")

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        loader = ctx.train_loader
        if not_a_dataloader(loader, findings):
            return
        chain = sampler_chain(loader)
        sampler = chain[-1]
        world = ctx.training.dist.world_size
        if isinstance(loader.dataset, IterableDataset):
            findings.data["summary"] = "IterableDataset: the dataset decides the order"
            findings.info(
                "RESUME_ORDER",
                "an IterableDataset cannot seek: a mid-epoch resume re-reads the batches the interrupted epoch "
                "consumed to skip them (under the RNG states that epoch started with, so a stream that depends "
                "only on them repeats exactly)",
            )
            return
        findings.data["sampler"] = type(sampler).__name__
        findings.data["summary"] = f"{type(sampler).__name__}"
        shuffled = not isinstance(sampler, SequentialSampler) and getattr(sampler, "shuffle", True)
        try:
            batches = len(loader)
        except TypeError:
            batches = None
        if not shuffled and batches == 1:
            # One batch per epoch (a full-batch graph, a tiny dataset): its order changes nothing.
            findings.data["summary"] += ", one batch per epoch"
        elif not shuffled:
            findings.warning(
                "DP14",
                f"the training loader is not shuffled ({type(sampler).__name__}): every epoch sees the data in "
                "the same order, and sorted data gives correlated batches",
                "Set data.shuffle=true (or pass a shuffling sampler).",
                "data.shuffle",
                code_fix="Pass shuffle=True (or a shuffling sampler such as RandomSampler) to the training DataLoader "
                         "your build_dataloaders() returns.",
            )
        with preserved_data_state(ctx):  # the probe advances the loader's generators
            check_resume_order(loader, findings, DataGuard(ctx, self.name, findings))
        replicas = _first_attribute(chain, ("num_replicas", "world_size", "num_processes"))
        rank = _first_attribute(chain, ("rank", "process_index"))
        if world > 1 and replicas != world:
            shard_fix = ("Use a DistributedSampler(dataset, num_replicas=world_size, rank=rank) with shuffle=False on "
                         "the DataLoader, and call set_epoch(epoch) each epoch.")
            findings.error(
                "DP2",
                f"{world} ranks but the {type(sampler).__name__} is not sharded across them"
                + (f" (it splits {replicas} ways)" if replicas else "")
                + ": every rank trains on the same samples",
                shard_fix,
                "data.train",
                code_fix=shard_fix,
            )
        elif world > 1 and rank is not None and rank != ctx.training.dist.rank:
            rank_fix = "Build the sampler with rank=torch.distributed.get_rank()."
            findings.error("DP2", f"the sampler reads shard {rank} but this process is rank {ctx.training.dist.rank}",
                           rank_fix, "data.train", code_fix=rank_fix)


def sampler_chain(loader: Any) -> list[Any]:
    """The objects that decide a loader's order, outermost first, ending at the one that
    orders the indices. A ``batch_sampler`` given to a DataLoader leaves ``loader.sampler``
    a placeholder SequentialSampler, and wrappers (accelerate's BatchSamplerShard, which
    the Hugging Face Trainer uses) nest the real sampler further in."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    if batch_sampler is None or getattr(batch_sampler, "sampler", None) is loader.sampler:
        return [loader.sampler]
    chain = [batch_sampler]
    while getattr(chain[-1], "batch_sampler", None) is not None:
        chain.append(chain[-1].batch_sampler)
    inner = getattr(chain[-1], "sampler", None)
    return chain + [inner] if inner is not None else chain


def _first_attribute(objects: list[Any], names: tuple[str, ...]) -> Any:
    for obj in objects:
        for name in names:
            value = getattr(obj, name, None)
            if value is not None:
                return value
    return None


REPLAY_PROBE_BATCHES = 4


def _plain_fields(sampler: Any) -> dict[str, Any]:
    """A sampler's int, float, bool and str attributes: the counters an epoch can advance."""
    return {key: value for key, value in vars(sampler).items()
            if isinstance(value, (int, float, bool, str)) and not key.startswith("__")}


def check_resume_order(loader: Any, findings: Findings, guard: DataGuard) -> None:
    """A resume replays the RNG states an epoch started with (epoch_replay); a sampler
    whose order comes from anything else (time, os.urandom, a NumPy Generator) gives
    another order after a resume. torch's samplers are known to replay; a custom one
    is shown to, by drawing its first batches twice from the same recorded states."""
    if not can_skip_by_index(loader):
        return
    suspects = custom_samplers(loader)
    if not suspects:
        return
    order = capture_order(loader)
    what = "the sampler's first batches"
    fields = [(sampler, _plain_fields(sampler)) for sampler in suspects]
    first = guard.call(first_index_batches, loader, order, REPLAY_PROBE_BATCHES, what=what)
    counted = [(sampler, before) for sampler, before in fields if _plain_fields(sampler) != before]
    for sampler, before in counted:  # a counter the draw advanced (self.epoch += 1): put it back
        vars(sampler).update(before)
    again = guard.call(first_index_batches, loader, order, REPLAY_PROBE_BATCHES, what=what)
    names = " and ".join(type(s).__name__ for s in suspects)
    findings.data["order_replays"] = first == again
    if first == again and counted:
        changed = sorted({key for sampler, before in counted for key, value in before.items()
                          if vars(sampler).get(key) != value} or {key for _, before in counted for key in before})
        findings.info(
            "RESUME_ORDER",
            f"the {names} draws its order from its own fields ({', '.join(changed[:3])}), which each epoch advances: "
            "from the same RNG states and fields it repeats its order, so a resume is exact once those fields are "
            "restored, which a checkpoint of the global RNGs does not do",
            "Give the sampler state_dict()/load_state_dict() for its counter, or set_epoch(epoch) as "
            "DistributedSampler does, so a resumed run starts the epoch from the same order.",
        )
    elif first != again:
        findings.warning(
            "RESUME_ORDER",
            f"the {names} draws a different order from the same RNG states (first batches {first[:2]} then "
            f"{again[:2]}): a checkpoint records torch's, Python's and NumPy's global RNGs and the torch.Generators "
            "the loader and its samplers hold, so after a mid-epoch resume this sampler continues the epoch in "
            "another order, repeating some samples and skipping others",
            "Draw the sampler's order from a torch.Generator it keeps as an attribute (seeded once, e.g. "
            "self.generator = torch.Generator().manual_seed(seed)) or from torch's global RNG; not from the time, "
            "os.urandom or a NumPy Generator.",
        )
