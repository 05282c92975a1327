"""A loss that depends on the order of the samples in a shuffled batch (``step.batch_order``).

A batch's samples come in the order the sampler drew them; with ``shuffle=True`` that order
is random. A loss over independent samples is the same for any order of them. One that is
not computes something of the order itself: a Cox partial likelihood whose risk sets are
``torch.logcumsumexp(risk, 0)`` (right only on a batch sorted by time, longest first), a
cumulative sum or a difference along the batch, pairs formed by position (``x[0::2]`` with
``x[1::2]``). On shuffled batches such a term is a random subset or pairing at every step,
and the loss trains on noise while it still falls.

The probe, in eval mode without gradients and with the random generator reseeded before each
call: the loss of the first batch, then of the same samples in another order (every
per-sample tensor permuted along its batch axis alike). The model's outputs must follow the
permutation (a model that mixes samples is ``step.sample_mixing``'s finding); the loss must
not move. A loss that draws random numbers moves between two seeds too; it is judged against
that spread. Batches with a tensor that is not per sample (a graph's adjacency, an edge
list, CTC's concatenated targets) are left alone: no permutation of the samples is known.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import DistributedSampler, RandomSampler, SubsetRandomSampler

from optimus_preflight.preflight.analyses.eval_forward import (
    eval_forward,
    loss_value,
    model_outputs,
    seeded_eval_forward,
)
from optimus_preflight.preflight.checks.batch_checks import sampler_chain
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.training.batches import batch_size_of, leaves, map_batch, move_to_device

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

MIN_SAMPLES = 8
SEED = 20240917
MOVED = 2e-4  # of the loss's magnitude: far above the rounding of a float32 sum taken in another order (~1e-7)
NOISE_MARGIN = 10.0  # times the loss's own spread between two seeds
CUMULATIVE = {"cumsum", "logcumsumexp", "cumprod", "cummax", "cummin", "diff"}


def draws_at_random(loader: Any) -> bool:
    """Whether the loader's order is random: shuffle=True, a random subset, a shuffling
    DistributedSampler. A plain list of batches keeps its order."""
    if not hasattr(loader, "sampler"):
        return False
    for item in sampler_chain(loader):
        if isinstance(item, (RandomSampler, SubsetRandomSampler)):
            return True
        if isinstance(item, DistributedSampler) and getattr(item, "shuffle", False):
            return True
    return False


def permuted_batch(batch: Any, order: torch.Tensor) -> Any | None:
    """The batch with every tensor's samples (dim 0) in ``order``; None when a tensor is not
    one row per sample (or is square in the samples: pairs, an adjacency)."""
    size = len(order)
    tensors = [leaf for leaf in leaves(batch) if isinstance(leaf, torch.Tensor) and leaf.dim() >= 1]
    if not tensors or any(t.shape[0] != size or t.layout != torch.strided for t in tensors):
        return None
    if any(t.dim() >= 2 and t.shape[1] == size for t in tensors):
        return None
    return map_batch(lambda value: value[order.to(value.device)] if isinstance(value, torch.Tensor)
                     and value.dim() >= 1 else value, batch)


class CumulativeOps(TorchFunctionMode):
    """Names the cumulative ops taken along dim 0 during the loss, and keeps the per-sample keys
    it sorts by (a survival loss's times)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.keys: list[torch.Tensor] = []  # 1-D keys of argsort / sort calls, one value per sample

    @property
    def sorted_with_ties(self) -> bool:
        """The loss sorts the samples by a key that has equal values."""
        return any(int(torch.unique(key).numel()) < key.numel() for key in self.keys)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("argsort", "sort") and args and isinstance(args[0], torch.Tensor) and args[0].numel() > 1 \
                and args[0].numel() == args[0].shape[0]:
            self.keys.append(args[0].detach().reshape(-1))
        if name in CUMULATIVE and args and isinstance(args[0], torch.Tensor):
            dim = kwargs.get("dim", args[1] if len(args) > 1 else (-1 if name == "diff" else None))
            tensor = args[0]
            if isinstance(dim, int) and tensor.dim() >= 1 and dim % tensor.dim() == 0 and name not in self.seen:
                self.seen.append(name)
        return func(*args, **kwargs)


class BatchOrderCheck(Check):
    """LOSS_ORDER_DEPENDENT: the loss of a shuffled batch changes with the order of its samples."""

    name = "step.batch_order"
    stage = Stage.STEP
    codes = ("LOSS_ORDER_DEPENDENT",)
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if not draws_at_random(ctx.train_loader):
            findings.data["summary"] = "the training loader keeps its order"
            return
        batch = move_to_device(ctx.artifacts.first_batch, ctx.device)
        size = batch_size_of(batch)
        if not size or size < MIN_SAMPLES:
            findings.data["summary"] = "batch too small to probe"
            return
        order = torch.randperm(size, generator=torch.Generator().manual_seed(SEED))
        permuted = permuted_batch(batch, order)
        if permuted is None:
            findings.data["summary"] = "a tensor of the batch is not one row per sample"
            return
        try:
            base, again, reordered = (self._loss(ctx, batch, SEED), self._loss(ctx, batch, SEED + 1),
                                      self._loss(ctx, permuted, SEED))
        except Exception:
            findings.data["summary"] = "the loss could not be computed on the reordered batch"
            return
        if base is None or again is None or reordered is None \
                or not all(math.isfinite(value) for value in (base, again, reordered)):
            # a NaN differs from itself: no order to blame (step.first_step names the NaN)
            findings.data["summary"] = "no finite scalar loss"
            return
        moved, noise = abs(reordered - base), abs(again - base)
        findings.data.update(loss=base, reordered_loss=reordered, seed_spread=noise)
        findings.data["summary"] = f"loss {base:.5g}, {reordered:.5g} with the samples reordered"
        if moved <= MOVED * max(abs(base), 1e-6) or moved <= NOISE_MARGIN * noise:
            return
        if not self._outputs_follow(ctx, batch, permuted, order):
            findings.data["summary"] = "the model's outputs do not follow the reordering (step.sample_mixing)"
            return
        watch = self._cumulative_ops(ctx, batch)
        if watch.sorted_with_ties:
            # The loss orders the samples itself; what the batch order still changes is the order
            # among equal keys (tied survival times), which no shuffle can make right or wrong.
            findings.data["summary"] = "the loss sorts the batch itself; only tied keys keep the batch order"
            return
        ops = watch.seen
        named = (f" The loss takes {', '.join(f'torch.{op}' for op in ops)} along dim 0, the batch: a cumulative "
                 "result over samples whose order is random." if ops else "")
        findings.warning(
            "LOSS_ORDER_DEPENDENT",
            f"the loss depends on the order of the samples in the batch: the first batch gives {base:.5g}, and the "
            f"same {size} samples in another order give {reordered:.5g}, while the model's outputs simply follow "
            "the reordering. The training loader shuffles, so every step computes this term over a random order."
            f"{named} A Cox partial likelihood's risk sets taken as torch.logcumsumexp(risk, 0) are right only on a "
            "batch sorted by time, longest first (DeepSurv-style code sorts the whole dataset once and never "
            "shuffles); pairs formed by position (x[0::2] with x[1::2]) or a difference between neighbouring "
            "samples pair random samples; a per-sample target built along the batch axis (label smoothing or a "
            "one-hot written target.scatter_(0, y.unsqueeze(1), value) where scatter_(1, ...) over the classes was "
            "meant) puts each sample's label mass in the rows of other samples",
            "Make the loss independent of the batch order: sort inside the loss (order = torch.argsort(time, "
            "descending=True); risk, event = risk[order], event[order] before logcumsumexp), or build pairs in the "
            "Dataset so each sample carries its partner; build per-sample targets along the class axis "
            "(target.scatter_(1, y.unsqueeze(1), value), or F.one_hot(y, num_classes)).",
        )

    @staticmethod
    def _loss(ctx: PreflightContext, batch: Any, seed: int) -> float | None:
        return loss_value(seeded_eval_forward(ctx, batch, seed))

    @staticmethod
    def _outputs_follow(ctx: PreflightContext, batch: Any, permuted: Any, order: torch.Tensor) -> bool:
        first, second = model_outputs(ctx, batch), model_outputs(ctx, permuted)
        if not first or not second or len(first) != len(second):
            return False
        size = len(order)
        for a, b in zip(first, second, strict=True):
            if a.shape != b.shape or a.shape[0] != size:
                return False
            expected = a[order.to(a.device)].float()
            scale = float(expected.abs().max().clamp_min(1e-6))
            if float((b.float() - expected).abs().max()) > 1e-4 * scale:
                return False
        return True

    @staticmethod
    def _cumulative_ops(ctx: PreflightContext, batch: Any) -> CumulativeOps:
        watch = CumulativeOps()
        try:
            with watch:
                eval_forward(ctx, batch)
        except Exception:
            return CumulativeOps()
        return watch
