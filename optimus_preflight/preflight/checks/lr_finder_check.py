"""Preflight side of the dynamics work: the LR range test as a check (O7)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
from omegaconf import OmegaConf

from optimus_preflight.dynamics.lr_finder import LRRangeResult, lr_range_test
from optimus_preflight.preflight.data_access.guard import DataGuard
from optimus_preflight.preflight.framework import Check, Findings, Stage
from optimus_preflight.reporting.json_records import dumps

if TYPE_CHECKING:
    from optimus_preflight.preflight.framework.context import PreflightContext

log = logging.getLogger("optimus_preflight")

# A configured LR this many times below the suggestion is the O7 "crawl" case.
TOO_LOW_FACTOR = 30.0


def cycled_batches(first: Any, source: Iterator[Any], limit: int) -> Iterator[Any]:
    """``first`` (the stored first batch, when the data checks left one), then the
    source's next batches; a loader shorter than ``limit`` is cycled."""
    seen: list[Any] = []
    if first is not None:
        seen.append(first)
        yield first
        next(source, None)  # the loader's first batch is the stored one
    for batch in itertools.islice(source, limit - len(seen)):
        seen.append(batch)
        yield batch
    if not seen:
        raise ValueError("the training DataLoader produced no batches")
    yield from itertools.cycle(seen)


def configured_lr(ctx: PreflightContext) -> float:
    """The peak LR the user set; the optimizer's own value may be mid-warmup."""
    value = OmegaConf.select(ctx.cfg, "optimizer.lr", default=None)
    if value is not None:
        return float(value)
    group = ctx.optimizer.param_groups[0]
    return float(group.get("initial_lr", group["lr"]))


class LRFinderCheck(Check):
    """Runs the LR range test when ``preflight.lr_finder=true``; writes lr_finder.json
    (and lr_finder.png with matplotlib) to the run dir and compares optimizer.lr."""

    name = "step.lr_finder"
    stage = Stage.STEP
    codes = ("O7", "O7_FLAT", "O7_HIGH")
    requires = ("data.first_batch",)

    def __init__(self, num_steps: int = 100, start_lr: float = 1e-7, end_lr: float = 10.0):
        self.num_steps = num_steps
        self.start_lr = start_lr
        self.end_lr = end_lr

    def run(self, ctx: PreflightContext, findings: Findings) -> None:
        if not OmegaConf.select(ctx.cfg, "preflight.lr_finder", default=False):
            findings.data["enabled"] = False
            return
        generator = getattr(ctx.train_loader, "generator", None)
        saved = generator.get_state() if isinstance(generator, torch.Generator) else None
        try:
            result = self._sweep(ctx, DataGuard(ctx, self.name, findings))
        finally:  # a new loader iterator draws its worker seed from the loader's generator
            if saved is not None:
                generator.set_state(saved)
        lr = configured_lr(ctx)
        findings.data.update(result.summary() | {"configured_lr": lr})
        if getattr(ctx.training.dist, "rank", 0) == 0:
            findings.data["files"] = write_outputs(result, Path(ctx.run_dir), lr)
        report(result, lr, findings)

    def _sweep(self, ctx: PreflightContext, guard: DataGuard) -> LRRangeResult:
        # Up to num_steps batches, each under the timeout (a hang is reported here,
        # naming its frame); the workers stop when the sweep ends.
        with guard.batches(ctx.train_loader, "the LR range test") as source:
            return lr_range_test(
                ctx.model,
                ctx.optimizer,
                ctx.compute_loss,
                cycled_batches(ctx.artifacts.first_batch, source, self.num_steps),
                start_lr=self.start_lr,
                end_lr=self.end_lr,
                num_steps=self.num_steps,
                device=ctx.device,
                autocast=ctx.training.plan.autocast,
                scaler=ctx.training.scaler,
                clip_grad_norm=OmegaConf.select(ctx.cfg, "trainer.clip_grad_norm", default=None),
            )


def report(result: LRRangeResult, lr: float, findings: Findings) -> None:
    if result.suggested_lr is None:
        findings.warning(
            "O7_FLAT",
            f"LR range test: the loss did not fall at any LR from {result.lrs[0]:.0e} to {result.lrs[-1]:.0e} ({result.stop_reason}).",
            "The model is not learning at any LR: check that the loss is attached to the model's output and the "
            "parameters are in the optimizer (O1-O4) before tuning optimizer.lr.",
            "optimizer.lr",
        )
        return
    suggested, top = result.suggested_lr, result.min_loss_lr
    findings.info(
        "O7",
        f"LR range test suggests optimizer.lr ~ {suggested:.1e} (loss lowest at {top:.1e}, "
        f"steepest descent at {_fmt(result.steepest_lr)}, diverged at {_fmt(result.diverged_lr)}); configured {lr:.1e}.",
        key="optimizer.lr",
    )
    if lr < suggested / TOO_LOW_FACTOR:
        findings.warning(
            "O7",
            f"optimizer.lr={lr:.1e} is over {TOO_LOW_FACTOR:g}x below the LR range test's suggestion {suggested:.1e}: the loss will crawl.",
            f"Set optimizer.lr={suggested:.1e} (or between it and {top:.1e}).",
            "optimizer.lr",
        )
    elif lr > top:
        findings.warning(
            "O7_HIGH",
            f"optimizer.lr={lr:.1e} is above {top:.1e}, where the LR range test's loss stopped falling: training is likely unstable.",
            f"Set optimizer.lr={suggested:.1e}, or lengthen scheduler.warmup_steps.",
            "optimizer.lr",
        )


def write_outputs(result: LRRangeResult, run_dir: Path, configured: float) -> list[str]:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "lr_finder.json"
    path.write_text(dumps(result.to_dict() | {"configured_lr": configured}, indent=1))
    written = [str(path)]
    try:
        from optimus_preflight.plotting.figures import plot_lr_finder
    except ImportError:  # matplotlib is optional: the JSON holds the same curve
        log.info("lr_finder.png not written: install matplotlib (pip install matplotlib) for the plot")
        return written
    written.append(str(plot_lr_finder(result.to_dict(), run_dir / "lr_finder.png", configured)))
    return written


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1e}"


def dynamics_checks() -> list[Check]:
    """The dynamics preflight checks, for the default check list."""
    return [LRFinderCheck()]
