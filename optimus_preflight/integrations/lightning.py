"""``PreflightCallback``: the preflight checks before the first step of a Lightning ``fit``.

Runs at ``on_train_start``: the loaders, optimizers and schedulers exist, the model is on
its device, and no optimizer step has run (the sanity validation has, and it changes no
weights). The loss is the module's own ``training_step`` with ``self.log`` muted; with
manual optimization ``training_step`` steps the optimizer itself, so pass ``loss_fn``.
A failed verdict raises ``PreflightFailed``, which ends ``fit`` before it trains.

The callback subclasses ``pytorch_lightning.Callback`` when that package is installed,
else ``lightning.pytorch.Callback``: a Trainer accepts callbacks of its own package only.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

try:
    import pytorch_lightning as pl
except ImportError:  # the unified `lightning` package ships the same API under lightning.pytorch
    import lightning.pytorch as pl  # type: ignore[no-redef]

from optimus_preflight.errors import PreflightFailed
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.preflight.standalone import run_preflight

log = logging.getLogger("optimus_preflight")

# Lightning's precision flags, by what the step computes in.
_PRECISION = {"32-true": "fp32", "32": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def preflight_precision(lightning_precision: Any) -> str:
    name = str(lightning_precision)
    if name not in _PRECISION:
        raise ValueError(f"PreflightCallback: Trainer(precision={name!r}) has no preflight equivalent; "
                         f"supported: {', '.join(_PRECISION)}")
    return _PRECISION[name]


@contextlib.contextmanager
def muted_logging(module: pl.LightningModule) -> Iterator[None]:
    """``self.log`` outside the loop would record preflight values as the run's metrics."""
    module.log = lambda *args, **kwargs: None  # type: ignore[method-assign]
    module.log_dict = lambda *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.log, module.log_dict


def training_step_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """The loss of ``model.training_step``: ``model`` is the module itself or a copy of it
    (the memory estimate runs one on fake tensors, the overfit check a deep copy)."""
    with muted_logging(model):
        output = model.training_step(batch, 0)
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, torch.Tensor):
        raise ValueError("training_step returned no loss tensor (None skips the batch): pass loss_fn= to "
                         "PreflightCallback to check this model")
    return loss


class PreflightCallback(pl.Callback):
    """``Trainer(callbacks=[PreflightCallback()])``: checks the fit before it trains.

    Keywords are passed to ``run_preflight`` (``fail_on``, ``disable``, ``overfit_steps``,
    ``target_gib``, ...); ``loss_fn(model, batch)`` replaces the module's training_step;
    ``run_dir`` (default: the trainer's log dir) receives ``preflight.json``. The report
    is kept in ``self.report``.
    """

    def __init__(self, *, loss_fn: Any = None, run_dir: str | Path | None = None, **preflight_kwargs: Any):
        self.loss_fn = loss_fn
        self.run_dir = run_dir
        self.preflight_kwargs = preflight_kwargs
        self.report: PreflightReport | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.loss_fn is None and not pl_module.automatic_optimization:
            raise ValueError("PreflightCallback: with manual optimization training_step steps the optimizer itself, "
                             "so it cannot serve as the loss; pass PreflightCallback(loss_fn=lambda model, batch: ...)")
        optimizers = trainer.optimizers
        if len(optimizers) != 1:
            log.warning("PreflightCallback: %d optimizers; the checks use the first", len(optimizers))
        configs = [c for c in trainer.lr_scheduler_configs if c.interval == "step"]
        stepping = trainer.estimated_stepping_batches
        self.report = run_preflight(
            pl_module,
            optimizers[0],
            trainer.train_dataloader,
            loss_fn=self.loss_fn or training_step_loss,
            # An epoch-interval scheduler steps once per epoch: the per-step LR check would misread it.
            scheduler=configs[0].scheduler if configs else None,
            precision=preflight_precision(trainer.precision),
            accumulation_steps=int(trainer.accumulate_grad_batches),
            max_steps=int(stepping) if math.isfinite(stepping) and stepping >= 1 else None,
            clip_grad_norm=trainer.gradient_clip_val if trainer.gradient_clip_algorithm == "norm" else None,
            run_dir=self.run_dir or trainer.log_dir or trainer.default_root_dir,
            # The trainer's loop calls model.train() before its first step.
            **{"loop_calls_train": True, **self.preflight_kwargs},
        )
        if self.report.failed:
            raise PreflightFailed(self.report)
