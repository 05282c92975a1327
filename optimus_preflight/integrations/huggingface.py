"""``PreflightTrainerCallback``: the preflight checks before the first step of a Hugging
Face ``Trainer``.

Runs at ``on_train_begin``: the optimizer, scheduler and train dataloader exist and no
step has run. The loss is ``model(**batch).loss``, what ``Trainer.compute_loss`` uses
for a model given ``labels``; a Trainer subclass with its own ``compute_loss`` passes
the equivalent ``loss_fn(model, batch)``. A failed verdict raises ``PreflightFailed``,
which ends ``train()`` before it trains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from optimus_preflight.errors import PreflightFailed
from optimus_preflight.preflight.framework.report import PreflightReport
from optimus_preflight.preflight.standalone import run_preflight


def unwrapped(wrapper: Any, attribute: str) -> Any:
    """accelerate wraps the optimizer and scheduler (``.optimizer``, ``.scheduler``); the
    checks read the torch objects' classes and state."""
    return getattr(wrapper, attribute, wrapper) if wrapper is not None else None


def preflight_precision(args: TrainingArguments) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


class PreflightTrainerCallback(TrainerCallback):
    """``Trainer(..., callbacks=[PreflightTrainerCallback()])``: checks the run before it trains.

    Keywords are passed to ``run_preflight`` (``fail_on``, ``disable``, ``target_gib``,
    ...); ``run_dir`` (default ``args.output_dir``) receives ``preflight.json``. The
    report is kept in ``self.report``.
    """

    def __init__(self, *, loss_fn: Any = None, run_dir: str | Path | None = None, **preflight_kwargs: Any):
        self.loss_fn = loss_fn
        self.run_dir = run_dir
        self.preflight_kwargs = preflight_kwargs
        self.report: PreflightReport | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.report = run_preflight(
            kwargs["model"],
            unwrapped(kwargs.get("optimizer"), "optimizer"),
            kwargs["train_dataloader"],
            loss_fn=self.loss_fn,
            scheduler=unwrapped(kwargs.get("lr_scheduler"), "scheduler"),
            precision=preflight_precision(args),
            accumulation_steps=int(args.gradient_accumulation_steps),
            max_steps=int(state.max_steps) if state.max_steps and state.max_steps > 0 else None,
            clip_grad_norm=float(args.max_grad_norm) if args.max_grad_norm else None,
            run_dir=self.run_dir or args.output_dir,
            # The trainer's loop calls model.train() before its first step.
            **{"loop_calls_train": True, **self.preflight_kwargs},
        )
        if self.report.failed:
            raise PreflightFailed(self.report)
