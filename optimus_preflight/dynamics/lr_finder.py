"""LR range test (Smith, catalog O7) on copies of the model and optimizer.

The LR grows geometrically from ``start_lr`` to ``end_lr``, one optimizer step per
batch, until the loss diverges. Rule for the suggestion, documented in the README:
smooth the losses with a centred 5-point moving median, take the LR at its minimum
(``min_loss_lr``: past it the LR is too large for the loss to keep falling) and
suggest one decade below it. ``steepest_lr``, where the smoothed loss falls fastest
against log(LR), is reported too. The caller's model, optimizer and RNG states are
left exactly as they were.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator

import torch
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training.batches import move_to_device
from optimus_preflight.training.distributed import unwrap
from optimus_preflight.training.step import LossFn, split_loss_output

SMOOTHING_WINDOW = 5
# The causal EMA that decides when to stop; a short memory so the stop is not late.
STOP_EMA_BETA = 0.8


@dataclass
class LRRangeResult:
    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    suggested_lr: float | None
    min_loss_lr: float | None
    steepest_lr: float | None
    # The LR at which the loss went non-finite or above diverge_factor x its best.
    diverged_lr: float | None
    stop_reason: str

    def to_dict(self) -> dict[str, Any]:
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in asdict(self).items()} | {
            "losses": [v if math.isfinite(v) else str(v) for v in self.losses]
        }

    def summary(self) -> dict[str, Any]:
        keys = ("suggested_lr", "min_loss_lr", "steepest_lr", "diverged_lr", "stop_reason")
        return {key: getattr(self, key) for key in keys} | {"steps": len(self.lrs)}


@contextlib.contextmanager
def preserved_rng(device: torch.device | None = None) -> Iterator[None]:
    """Restore torch (CPU and the given CUDA device), Python and NumPy RNG states on exit."""
    python_state = random.getstate()
    try:
        import numpy as np

        numpy_state = np.random.get_state()
    except ImportError:  # numpy is optional
        np, numpy_state = None, None
    devices = [device] if device is not None and device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        if np is not None:
            np.random.set_state(numpy_state)


def copy_model_and_optimizer(model: nn.Module, optimizer: Optimizer) -> tuple[nn.Module, Optimizer]:
    """Independent copies. The optimizer is rebuilt, not deep-copied: an LR scheduler
    patches ``optimizer.step`` with a closure over the original optimizer, which a
    deepcopy would keep, and the copy's steps would then move the real weights."""
    source = unwrap(model)
    clone = copy.deepcopy(source)
    mapping = {id(p): q for p, q in zip(source.parameters(), clone.parameters())}
    groups = []
    for group in optimizer.param_groups:
        missing = [p for p in group["params"] if id(p) not in mapping]
        if missing:
            raise ValueError(f"{len(missing)} optimizer parameters are not parameters of the model (O2)")
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [mapping[id(p)] for p in group["params"]]})
    try:
        optimizer_clone = type(optimizer)(groups, **optimizer.defaults)
    except TypeError:  # a custom optimizer whose defaults are not all constructor arguments
        optimizer_clone = type(optimizer)(groups)
    optimizer_clone.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    return clone, optimizer_clone


def geometric_lrs(start_lr: float, end_lr: float, num_steps: int) -> list[float]:
    if num_steps < 2:
        return [start_lr]
    return [start_lr * (end_lr / start_lr) ** (i / (num_steps - 1)) for i in range(num_steps)]


def centred_median(values: list[float], window: int = SMOOTHING_WINDOW) -> list[float]:
    """A median, not a mean: one spiking batch must not move the minimum."""
    half = window // 2
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def lr_range_test(
    model: nn.Module,
    optimizer: Optimizer,
    compute_loss: LossFn,
    batches: Iterable[Any],
    *,
    start_lr: float = 1e-7,
    end_lr: float = 10.0,
    num_steps: int = 100,
    device: torch.device | None = None,
    autocast: Callable[[], ContextManager] = contextlib.nullcontext,
    scaler: torch.amp.GradScaler | None = None,
    clip_grad_norm: float | None = None,
    diverge_factor: float = 4.0,
) -> LRRangeResult:
    """Sweep the LR over ``num_steps`` batches on copies; see the module docstring.

    Multiple parameter groups keep their LR ratios to the first group. ``scaler`` is
    copied too (fp16); the copies are dropped at the end. One batch per step (no
    accumulation) and no LR scheduler: the sweep itself is the schedule. Memory: one
    extra copy of the model and of the optimizer state while it runs.
    """
    device = device or next(model.parameters()).device
    lrs_planned = geometric_lrs(start_lr, end_lr, num_steps)
    lrs: list[float] = []
    losses: list[float] = []
    stop_reason, diverged_lr = "reached end_lr", None
    with preserved_rng(device):
        net, opt = copy_model_and_optimizer(model, optimizer)
        net.train()
        grad_scaler = copy.deepcopy(scaler) if scaler is not None and scaler.is_enabled() else None
        base = opt.param_groups[0]["lr"] or 1.0
        ratios = [(group["lr"] / base) if base else 1.0 for group in opt.param_groups]
        ema, best = 0.0, math.inf
        for index, (lr, batch) in enumerate(zip(lrs_planned, batches)):
            for group, ratio in zip(opt.param_groups, ratios):
                group["lr"] = lr * ratio
            loss = _train_step(net, opt, compute_loss, move_to_device(batch, device), autocast, grad_scaler, clip_grad_norm)
            lrs.append(lr)
            losses.append(loss)
            if not math.isfinite(loss):
                stop_reason, diverged_lr = "loss became non-finite", lr
                break
            ema = STOP_EMA_BETA * ema + (1 - STOP_EMA_BETA) * loss
            smoothed = ema / (1 - STOP_EMA_BETA ** (index + 1))
            best = min(best, smoothed)
            if smoothed > diverge_factor * best:
                stop_reason, diverged_lr = f"loss rose above {diverge_factor:g}x its minimum", lr
                break
        del net, opt, grad_scaler
    return _analyse(lrs, losses, stop_reason, diverged_lr)


def _train_step(net, opt, compute_loss, batch, autocast, scaler, clip_grad_norm) -> float:
    opt.zero_grad(set_to_none=True)
    with autocast():
        loss, _ = split_loss_output(compute_loss(net, batch), batch)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(opt)
    if clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(net.parameters(), clip_grad_norm)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return float(loss.detach())


def _analyse(lrs: list[float], losses: list[float], stop_reason: str, diverged_lr: float | None) -> LRRangeResult:
    finite = [i for i, v in enumerate(losses) if math.isfinite(v)]
    kept = list(range(finite[-1] + 1)) if finite else []
    smoothed = centred_median([losses[i] for i in kept]) if kept else []
    suggested = min_loss = steepest = None
    if len(smoothed) >= 3:
        low = min(range(len(smoothed)), key=smoothed.__getitem__)
        if smoothed[low] < smoothed[0]:
            min_loss = lrs[low]
            suggested = min_loss / 10.0
            slopes = [(smoothed[i + 1] - smoothed[i]) / math.log(lrs[i + 1] / lrs[i]) for i in range(low)]
            if slopes:
                steepest = lrs[min(range(len(slopes)), key=slopes.__getitem__)]
        else:
            stop_reason += "; the loss never fell below its starting value"
    return LRRangeResult(lrs, losses, smoothed, suggested, min_loss, steepest, diverged_lr, stop_reason)
