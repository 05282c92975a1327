"""Checks that run extra real steps or forwards, each inside ``preserved_training_state``:
accumulation scaling, and the scale of the returned loss (a sum, or a division by the
accumulation steps on top of the step's own weighting). The checkpoint round trip and the
overfit smoke are ``step_smoke``."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from optimus_preflight.preflight.analyses.loss_findings import criterion_ratio
from optimus_preflight.preflight.analyses.loss_spy import LossSpy
from optimus_preflight.preflight.analyses.probe import get_probe
from optimus_preflight.preflight.analyses.trial_steps import make_runner
from optimus_preflight.preflight.checks.step_checks import FIRST_STEP
from optimus_preflight.preflight.data_access.samples import concat_batches, split_batch
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.preflight.framework.preserve import preserved_training_state
from optimus_preflight.training.batches import batch_size_of, move_to_device
from optimus_preflight.training.step import split_loss_output

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

ACCUMULATION_RTOL = 0.05
STOCHASTIC_RATIO_RTOL = 0.25  # a loss that draws at random: a sum still gives 1/K <= 0.5
STOCHASTIC_COSINE_GAP = 0.2


class GradRecorder(Optimizer):
    """An optimizer whose step() copies the (unscaled, weighted) gradients instead of updating."""

    def __init__(self, params: list[torch.Tensor]):
        super().__init__(params, {"lr": 0.0})  # StepRunner reads each group's lr
        self.grads: list[torch.Tensor] = []

    def step(self, closure: Any = None) -> None:
        self.grads = [p.grad.detach().float().flatten().clone() for g in self.param_groups for p in g["params"] if p.grad is not None]


@contextmanager
def foreign_zero_grads(own: Optimizer) -> Iterator[list[str]]:
    """Records every ``Optimizer.zero_grad`` / ``Module.zero_grad`` call not made on
    ``own`` (the step's optimizer) while it is open: inside a window only user code
    (compute_loss, a hook) makes them, and each one throws the micro-batches so far away."""
    calls: list[str] = []
    optimizer_zero_grad, module_zero_grad = Optimizer.zero_grad, torch.nn.Module.zero_grad

    def on_optimizer(self: Optimizer, *args: Any, **kwargs: Any) -> Any:
        if self is not own:
            calls.append(f"{type(self).__name__}.zero_grad()")
        return optimizer_zero_grad(self, *args, **kwargs)

    def on_module(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls.append(f"{type(self).__name__}.zero_grad()")
        return module_zero_grad(self, *args, **kwargs)

    Optimizer.zero_grad, torch.nn.Module.zero_grad = on_optimizer, on_module  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        Optimizer.zero_grad, torch.nn.Module.zero_grad = optimizer_zero_grad, module_zero_grad  # type: ignore[method-assign]


@contextmanager
def cleared_gradients(params: list[torch.Tensor]) -> Iterator[list[int]]:
    """Counts the micro-batches (after the first) whose backward found the gradient
    accumulated so far gone: a ``p.grad = None`` in a hook or the model's forward, which no
    zero_grad() spy sees. Watched on a few parameters: the incoming gradient against the
    total after accumulation (equal means nothing was there to add to)."""
    cleared = [0]  # the most any watched parameter saw (one may get no gradient at all)
    per_param: dict[int, int] = {}
    watched = params[:3]
    incoming: dict[int, torch.Tensor] = {}
    had_total: dict[int, bool] = {}
    handles = []
    for index, param in enumerate(watched):
        def on_grad(grad: torch.Tensor, index: int = index) -> None:
            incoming[index] = grad.detach().clone()

        def on_accumulated(param: torch.Tensor, index: int = index) -> None:
            arrived = incoming.pop(index, None)
            if arrived is None or param.grad is None:
                return
            total = param.grad.detach()
            nonzero = bool(arrived.abs().sum() > 0)
            if had_total.get(index) and nonzero and torch.equal(total, arrived):
                per_param[index] = per_param.get(index, 0) + 1
                cleared[0] = max(per_param.values())
            had_total[index] = bool(total.abs().sum() > 0)

        handles.append(param.register_hook(on_grad))
        handles.append(param.register_post_accumulate_grad_hook(on_accumulated))
    try:
        yield cleared
    finally:
        for handle in handles:
            handle.remove()


def compare_gradients(accumulated: list[torch.Tensor], full: list[torch.Tensor]) -> tuple[float, float]:
    """(norm ratio accumulated/full, cosine similarity) of two gradient lists."""
    a, b = torch.cat(accumulated), torch.cat(full)
    ratio = float(a.norm() / b.norm().clamp_min(1e-30))
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0, eps=1e-30))
    return ratio, cosine


def accumulation_sample(batches: list[Any], accumulation_steps: int) -> tuple[Any, int]:
    """(samples, micro-batches) for the accumulation check, never more samples than one
    configured micro-batch holds (with a floor of two), so the full-batch reference fits
    wherever a training step fits: the configured split when the first batch has at
    least ``accumulation_steps`` samples, else one sample per micro-batch."""
    first = batches[0]
    size = batch_size_of(first)
    if size >= accumulation_steps:
        return first, accumulation_steps
    wanted = max(size, 2)
    pool = concat_batches(batches)
    available = batch_size_of(pool)
    if available > wanted:
        pool = split_batch(pool, available)[:wanted]
        pool = concat_batches(pool)
    return pool, min(wanted, available)


class AccumulationCheck(Check):
    """O9: K accumulated micro-batches must give the gradient of one batch of all of them."""

    name = "step.accumulation"
    stage = Stage.STEP
    codes = ("O9",)
    requires = (FIRST_STEP,)

    @classmethod
    def applies(cls, cfg: Any) -> bool:
        return cfg.trainer.accumulation_steps > 1

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        configured = ctx.cfg.trainer.accumulation_steps
        batch, steps = accumulation_sample(ctx.artifacts.window_batches or [ctx.artifacts.first_batch], configured)
        if steps < 2:
            findings.info("O9", "not verified: the data checks fetched a single sample (the check needs two)")
            return
        micro = split_batch(batch, steps)
        params = [p for g in ctx.optimizer.param_groups for p in g["params"] if p.requires_grad]
        # cuDNN's RNN kernels refuse a backward in eval mode; the native ones give the same gradients
        try:
            with preserved_training_state(ctx), torch.backends.cudnn.flags(enabled=False):
                ctx.model.eval()  # no dropout, no batch statistics: both passes compute the same function
                recorder = GradRecorder(params)
                make_runner(ctx, ctx.model, recorder, accumulation_steps=1, clip=False).run(iter([(batch, True)]))
                full = recorder.grads
                # The same batch again: a loss that draws (sampled negatives, noise) differs from itself.
                make_runner(ctx, ctx.model, recorder, accumulation_steps=1, clip=False).run(iter([(batch, True)]))
                again = recorder.grads
                window = [(part, index == steps - 1) for index, part in enumerate(micro)]
                with foreign_zero_grads(recorder) as zeroed, cleared_gradients(params) as cleared:
                    make_runner(ctx, ctx.model, recorder, accumulation_steps=steps, clip=False).run(iter(window))
                accumulated = recorder.grads
        except Exception as error:
            # Training accumulates whole loader batches; only this check cuts one by rows, and a
            # batch whose rows are not its samples (collated graphs: node rows, an edge index
            # into them) does not survive the cut.
            findings.info("O9", f"not verified: compute_loss raised {type(error).__name__} on the batch cut into "
                                f"{steps} micro-batches by rows (a batch whose rows are not its samples, such as "
                                "collated graphs, cannot be cut that way)")
            return
        if not full or len(full) != len(accumulated):
            findings.info("O9", "not verified: no gradients to compare")
            return
        ratio, cosine = compare_gradients(accumulated, full)
        noise_ratio, noise_cosine = compare_gradients(again, full) if len(again) == len(full) else (1.0, 1.0)
        size = batch_size_of(batch)
        findings.data.update(accumulation_steps=steps, samples=size, norm_ratio=round(ratio, 5), cosine=round(cosine, 6),
                             repeat_cosine=round(noise_cosine, 6))
        findings.data["summary"] = (f"{steps} micro-batches vs one batch of {size} samples: norm ratio {ratio:.4f}, "
                                    f"cosine {cosine:.5f}")
        mismatch = abs(ratio - 1) > ACCUMULATION_RTOL or cosine < 1 - ACCUMULATION_RTOL
        if abs(noise_ratio - 1) > ACCUMULATION_RTOL or noise_cosine < 1 - ACCUMULATION_RTOL:
            # The loss draws at random: one batch differs from itself. Only what no draw explains
            # counts: a size off by far more than the draws move it (a sum gives 1/K), or a
            # direction far from both.
            mismatch = abs(ratio - 1) > STOCHASTIC_RATIO_RTOL or cosine < noise_cosine - STOCHASTIC_COSINE_GAP
            findings.data["stochastic_loss"] = True
        if not zeroed and cleared[0] and mismatch:
            findings.data["cleared_between_micro_batches"] = cleared[0]
            findings.error(
                "O9",
                f"the gradients accumulated so far are gone when {cleared[0]} of the {steps - 1} later micro-batches of "
                "a window run backward (set to None or zeroed outside zero_grad(): a hook or the model's forward "
                f"doing p.grad = None), so the step gets {ratio:.3g}x the gradient of the same samples in one batch "
                f"(cosine {cosine:.3f}), essentially the last micro-batch's",
                "Remove the code that clears .grad from the hook or forward: the training step zeroes the "
                "gradients once per optimizer step, after it.",
                code_fix="Remove the code that clears .grad from your hook or forward: zero the gradients once per "
                         "optimizer step, after optimizer.step().",
            )
            return
        if zeroed and mismatch:
            findings.data["zero_grad_calls"] = len(zeroed)
            findings.error(
                "O9",
                f"{zeroed[0]} is called {len(zeroed)} time(s) inside one accumulation window of {steps} "
                "micro-batches (from compute_loss or a hook), so each call discards the gradients accumulated so "
                f"far: the step gets {ratio:.3g}x the gradient of the same samples in one batch (cosine "
                f"{cosine:.3f}), essentially the last micro-batch's",
                "Remove the zero_grad() call from compute_loss (and from any hook): the training step zeroes the "
                "gradients once per optimizer step, after it.",
                code_fix="Remove the zero_grad() call from your loss function or hook: zero the gradients once per "
                         "optimizer step, after optimizer.step().",
            )
            return
        if mismatch:
            # A sum over the micro-batch grows with its size; the step's weighting by each
            # micro-batch's share comes on top, so K micro-batches give 1/K of one batch.
            summed = abs(ratio * steps - 1) <= ACCUMULATION_RTOL and cosine >= 1 - ACCUMULATION_RTOL
            cause = (f", i.e. 1/{steps}: compute_loss returns a sum over the micro-batch (reduction='sum', or .sum() "
                     "of per-target losses), which already grows with the micro-batch size, and the step weights "
                     "each micro-batch by its share of the window on top, so the gradient's size depends on how "
                     "the batch is split: the effective learning rate changes with data.batch_size and "
                     "trainer.accumulation_steps") if summed else (
                     ": the effective learning rate changes with trainer.accumulation_steps")
            if summed and (why := scale_free_update(ctx)) is not None:
                findings.info("O9", f"accumulating {steps} micro-batches gives 1/{steps} of the gradient of the same "
                                    f"samples in one batch (compute_loss returns a sum); {why}, so the factor does "
                                    "not reach the update. It would under SGD or gradient clipping",
                              "Return the mean (or (loss_sum / count, count)) before switching to SGD or clipping.")
                return
            if not summed and (coupled := coupled_loss(ctx, batch, micro)) is not None:
                whole, parts = coupled
                findings.error(
                    "O9",
                    f"accumulating {steps} micro-batches gives {ratio:.3g}x the gradient of the same samples in one "
                    f"batch (cosine {cosine:.3f}) because the loss couples the samples of its batch: the batch's loss "
                    f"is {whole:.4g} while its {steps} micro-batches average {parts:.4g} (in eval mode, so no dropout). A "
                    "contrastive loss whose negatives are the other samples of the batch (InfoNCE / CLIP, a (B, B) "
                    "similarity matrix), batch-hard mining, or a statistic over the batch sees only a micro-batch's "
                    "samples: each micro-batch of a contrastive loss has a fraction of the negatives, so accumulation "
                    "is not a larger batch",
                    "Keep the whole batch in one forward (trainer.accumulation_steps=1 with a larger micro-batch if it "
                    "fits), or make the loss see every negative: gradient caching (GradCache: embed all micro-batches "
                    "without gradients, compute the full-batch loss, then backpropagate per micro-batch), or a queue / "
                    "memory bank of negatives.",
                    "trainer.accumulation_steps",
                )
                return
            findings.error(
                "O9",
                f"accumulating {steps} micro-batches gives {ratio:.3g}x the gradient of the same samples in one batch "
                f"(cosine {cosine:.3f}){cause}",
                "Return the mean loss over the micro-batch from compute_loss, or (loss, count) where count is the "
                "number of targets that mean is taken over; not a sum.",
                "trainer.accumulation_steps",
                code_fix="In your compute_loss, return the mean over the micro-batch (reduction='mean'), or "
                         "(loss_sum / count, count) with count the number of targets summed.",
            )


# Optimizers whose update divides the gradient by a running estimate of its own size: a
# constant factor on the loss (a sum is the mean times the batch size) cancels out of it.
SCALE_FREE_OPTIMIZERS = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta")


def scale_free_update(ctx: PreflightContext) -> str | None:
    """Why a summed loss cannot change this run's updates, or None where it can: every
    group's optimizer normalises the gradient's scale, no gradient clipping reads the
    norm, and no coupled L2 decay (Adam's weight_decay) is weighed against the gradient."""
    optimizer = ctx.optimizer
    name = type(optimizer).__name__
    if name not in SCALE_FREE_OPTIMIZERS or ctx.cfg.trainer.get("clip_grad_norm"):
        return None
    decoupled = name == "AdamW" or any(group.get("decoupled_weight_decay") for group in optimizer.param_groups)
    if not decoupled and any(group.get("weight_decay", 0) for group in optimizer.param_groups):
        return None
    return f"{name} divides each gradient by a running estimate of its own size and nothing clips the norm"


SUM_RTOL = 0.02  # eval-mode losses of per-sample terms add up to float rounding
SAMPLES_SUMMED = 8  # samples whose one-at-a-time losses must add up to their joint loss
MEAN_GAP = 0.2  # and a mean is then ~2x away from the sum


def _loss_and_count(ctx: PreflightContext, batch: Any) -> tuple[float, float]:
    batch = move_to_device(batch, ctx.device)
    with ctx.training.plan.autocast():
        loss, count = split_loss_output(ctx.compute_loss(ctx.model, batch), batch)
    return float(loss.float()), float(count)


COUPLED_RTOL = 0.05  # micro-batches' mean loss this far from the batch's: the samples interact


def coupled_loss(ctx: PreflightContext, batch: Any, micro: list[Any]) -> tuple[float, float] | None:
    """(the batch's loss, its micro-batches' count-weighted mean loss) when they differ: a loss
    that is not a mean of per-sample terms. Eval mode, one seed per call."""
    try:
        with preserved_training_state(ctx), torch.no_grad():
            ctx.model.eval()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                whole, _ = _loss_and_count(ctx, batch)
            parts = []
            for part in micro:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(0)
                    parts.append(_loss_and_count(ctx, part))
    except Exception:
        return None
    total = sum(count for _, count in parts)
    mean = sum(value * count for value, count in parts) / max(total, 1e-12)
    if not all(math.isfinite(v) for v in (whole, mean)) or abs(whole - mean) <= COUPLED_RTOL * max(abs(whole), 1e-12):
        return None
    return whole, mean


def summed_loss(full: tuple[float, float], halves: list[tuple[float, float]]) -> bool:
    """True when the loss of a batch is the sum of its halves' losses, not their
    (count-weighted) mean: the loss grows with the batch size."""
    (loss, count), values = full, [value for value, _ in halves]
    mean = sum(value * n for value, n in halves) / max(count, 1e-12)
    if not all(math.isfinite(x) for x in (loss, mean, *values)) or abs(loss) < 1e-12:
        return False
    return abs(loss - sum(values)) <= SUM_RTOL * abs(loss) and abs(loss - mean) > MEAN_GAP * abs(loss)


MIN_QUARTER = 4  # samples in each quarter of the batch
SUMMED_SHARE = 0.2  # of the batch loss, for a summed term to be reported
LINEAR_RTOL = 0.05  # quarters vs halves: how exactly the losses must fit mean + sum


def summed_term(full: float, halves: list[float], quarters: list[float]) -> float | None:
    """The share of ``full`` that a term summed over the samples makes up, when the loss is a
    per-sample mean plus such a sum and that term is a sizeable part of it; else None.

    Split into k parts, a loss ``r + s`` (r: mean over samples, s: sum over them) gives parts
    summing to ``k r + s``: linear in k. A loss that couples samples (in-batch negatives,
    batch-hard mining) changes with the batch size in another way and is not linear in k."""
    if len(halves) != 2 or len(quarters) != 4 or not all(math.isfinite(v) for v in (full, *halves, *quarters)):
        return None
    one, two, four = full, sum(halves), sum(quarters)
    mean_term, sum_term = two - one, 2 * one - two
    if abs(one) < 1e-12 or abs(mean_term) < 1e-12:
        return None
    linear = abs((four - two) - 2 * (two - one)) <= LINEAR_RTOL * abs(four - two)
    share = sum_term / one
    if not linear or not SUMMED_SHARE <= share <= 1 - SUMMED_SHARE:
        return None
    return share


class LossScaleCheck(Check):
    """O9 shapes the step's own accumulation weighting cannot undo: ``compute_loss``
    dividing by the accumulation steps itself (gradients K times too small; seen as the
    returned loss being 1/K of the criterion's), or, without accumulation, returning a
    sum (its batch's loss is the sum of its halves': the gradient grows with the batch
    size; with accumulation ``step.accumulation`` sees the sum)."""

    name = "step.loss_scale"
    stage = Stage.STEP
    codes = ("O9", "LOSS_MULTIPLIED")
    requires = (FIRST_STEP,)

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        steps = ctx.cfg.trainer.accumulation_steps
        self._multiplied(ctx, findings)
        if steps > 1:
            self._divided_by_steps(ctx, findings, steps)
        else:
            self._summed(ctx, findings)

    @staticmethod
    def _multiplied(ctx: PreflightContext, findings: Findings) -> None:
        """compute_loss returns a power-of-two multiple of its one criterion (8x or more): a
        static loss scale left from an fp16 script, with nothing dividing the gradients back."""
        probe = get_probe(ctx)
        calls = [c for c in probe.criterion_calls if c.error is None]
        ratio = criterion_ratio(calls, probe.loss.value if probe.loss else None) if len(calls) == 1 else None
        if ratio is None or ratio < 8 or abs(math.log2(ratio) - round(math.log2(ratio))) > 1e-4:
            return
        scale = round(ratio)
        if scale == getattr(ctx.train_loader, "batch_size", None):
            return  # a mean times the batch size is a sum: step.accumulation / O9 judge that
        findings.warning(
            "LOSS_MULTIPLIED",
            f"compute_loss returns exactly {scale}x its criterion's loss ({calls[0].function}): every gradient is "
            f"{scale}x what the learning rate was tuned for. A power of two like this is a static loss scale "
            "left from an fp16 script (apex-style loss * scale) whose gradients are never divided back; the "
            "training step's own GradScaler handles fp16",
            f"Return the criterion's loss itself (drop the * {scale}); for fp16 use trainer.precision=fp16, whose "
            "GradScaler scales and unscales the gradients.",
        )

    def _divided_by_steps(self, ctx: PreflightContext, findings: Findings, steps: int) -> None:
        probe = get_probe(ctx)
        ratio = criterion_ratio(probe.criterion_calls, probe.loss.value if probe.loss else None)
        against = "its criterion's loss"
        if ratio is None and probe.loss_constant_factor is not None:
            # A hand-written loss: no criterion to compare with, but its last op scales by a constant.
            ratio, against = probe.loss_constant_factor, "the loss it computes (its last op scales by a constant)"
        findings.data.update(accumulation_steps=steps, loss_to_criterion=None if ratio is None else round(ratio, 6))
        findings.data["summary"] = ("no criterion seen" if ratio is None
                                    else f"returned loss = {ratio:.4g} x the criterion's")
        if ratio is None or abs(ratio * steps - 1) > 1e-3:
            return
        confirmed = ctx.key_applies("trainer.accumulation_steps") and self._follows_setting(ctx, steps + 1)
        effect = (f"the training step already weights each micro-batch by its share of the window, so the loss is "
                  f"divided by the accumulation steps twice and the gradients are {steps}x too small: an effective "
                  f"learning rate of lr/{steps}")
        fix = ("Remove the division by the accumulation steps from compute_loss: return the micro-batch's mean loss "
               "(optionally with the number of targets it averages over); the training step does the accumulation "
               "weighting.")
        code_fix = "In your compute_loss, return the loss without dividing it by the accumulation steps."
        if confirmed:
            findings.error(
                "O9",
                f"compute_loss divides its loss by trainer.accumulation_steps: it returns 1/{steps} of {against}, "
                f"and 1/{steps + 1} with trainer.accumulation_steps={steps + 1}; {effect}",
                fix, code_fix=code_fix,
            )
        else:
            findings.warning(
                "O9",
                f"compute_loss returns exactly 1/{steps} of {against}, and {steps} is the number of "
                f"accumulation steps: if it divides by them, {effect}. (A deliberate loss weight of 1/{steps} "
                "is fine.)",
                fix, code_fix=code_fix,
            )

    @staticmethod
    def _follows_setting(ctx: PreflightContext, steps: int) -> bool:
        """Whether compute_loss's factor follows trainer.accumulation_steps (one no-grad forward)."""
        trainer = ctx.cfg.trainer
        configured = trainer.accumulation_steps
        spy = LossSpy()
        batch = ctx.artifacts.first_batch
        try:
            trainer.accumulation_steps = steps
        except Exception:  # a read-only config: nothing to vary
            return False
        try:
            with preserved_training_state(ctx), torch.no_grad():
                ctx.model.eval()  # same function as the probe's up to dropout; the ratio is what counts
                with spy:
                    returned, _ = _loss_and_count(ctx, batch)
        except Exception:
            return False
        finally:
            trainer.accumulation_steps = configured
        ratio = criterion_ratio(spy.calls, returned)
        return ratio is not None and abs(ratio * steps - 1) <= 1e-3

    @staticmethod
    def _sum_of_samples(ctx: PreflightContext, batch: Any) -> bool:
        """Whether the loss of the batch's first few samples is the sum of their losses taken
        one at a time: a sum of per-sample terms, which a scale-free optimizer cancels. A
        loss that adds up over the batch because it mixes the samples (a distance taken over
        the whole batch, .sum() with no dim) is not, whatever the optimizer."""
        few = split_batch(batch, math.ceil(batch_size_of(batch) / SAMPLES_SUMMED))[0]
        try:
            with preserved_training_state(ctx), torch.no_grad():
                ctx.model.eval()
                together = _loss_and_count(ctx, few)[0]
                alone = [_loss_and_count(ctx, one)[0] for one in split_batch(few, batch_size_of(few))]
        except Exception:  # a step that needs more than one sample
            return False
        return math.isfinite(together) and abs(together - sum(alone)) <= SUM_RTOL * max(abs(together), 1e-12)

    def _summed(self, ctx: PreflightContext, findings: Findings) -> None:
        batch = ctx.artifacts.first_batch
        if batch_size_of(batch) < 2:
            findings.data["summary"] = "not verified: the first batch holds one sample"
            return
        try:
            with preserved_training_state(ctx), torch.no_grad():
                ctx.model.eval()  # no dropout, no batch statistics: per-sample terms add up exactly
                full = _loss_and_count(ctx, batch)
                halves = [_loss_and_count(ctx, part) for part in split_batch(batch, 2)]
                quarters = ([_loss_and_count(ctx, part) for part in split_batch(batch, 4)]
                            if batch_size_of(batch) >= 4 * MIN_QUARTER else [])
        except Exception as error:  # e.g. a model whose eval() forward returns predictions
            findings.data["summary"] = f"not verified: compute_loss in eval mode raised {type(error).__name__}"
            return
        findings.data.update(batch_loss=full[0], half_losses=[value for value, _ in halves])
        findings.data["summary"] = (f"batch loss {full[0]:.4g}, halves {halves[0][0]:.4g} and {halves[1][0]:.4g}")
        summed = summed_loss(full, halves)
        if summed and (why := scale_free_update(ctx)) is not None and self._sum_of_samples(ctx, batch):
            findings.info(
                "O9",
                f"compute_loss returns a sum over the batch, not a mean (the first batch's loss {full[0]:.4g} is the "
                f"sum of its halves' {halves[0][0]:.4g} + {halves[1][0]:.4g}); {why}, so the sum's size does not "
                "reach the update. It would under SGD or gradient clipping",
                "Return the mean (or (loss_sum / count, count)) before switching to SGD or clipping.",
            )
        elif summed:
            findings.warning(
                "O9",
                f"compute_loss returns a sum over the batch, not a mean: the first batch's loss ({full[0]:.4g}) is "
                f"the sum of its halves' losses ({halves[0][0]:.4g} + {halves[1][0]:.4g}), not their average. "
                "The gradient grows with the batch size: data.batch_size scales the effective learning rate and "
                "what trainer.clip_grad_norm clips, a smaller last batch weighs less, and trainer.accumulation_steps "
                "would shrink the gradient again by the number of micro-batches",
                "Return the mean loss over the batch (reduction='mean'), or (loss_sum / count, count) with count "
                "the number of targets summed; the training step weights batches by count.",
                code_fix="In your compute_loss, divide the summed loss by the number of targets it sums (return "
                         "loss_sum / count, count) or use reduction='mean'.",
            )
        elif (term := summed_term(full[0], [value for value, _ in halves], [value for value, _ in quarters])) is not None:
            findings.data["summed_share"] = round(term, 3)
            findings.warning(
                "O9",
                f"part of the loss is summed over the batch: the first batch's loss ({full[0]:.4g}) splits into a "
                f"per-sample mean and a term that grows with the number of samples ({term:.0%} of it; halves and "
                "quarters of the batch give losses that fit mean + sum exactly). That term's weight against the "
                "rest is set by data.batch_size: a term with reduction='sum' or .sum(dim=0) over the samples beside "
                "mean-reduced ones, e.g. a VAE's KL summed over the batch while the reconstruction is averaged, "
                "outweighs the others by the batch size",
                "Reduce every term the same way: average the summed term over the samples (kl.sum(dim=1).mean(), "
                "or divide it by the batch size) before adding it to the mean-reduced ones.",
                code_fix="In your compute_loss, average over the batch the term that is summed over it.",
            )
