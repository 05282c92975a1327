"""Semantic validation of a composed config, before any model, data or file is touched.

Types and unknown keys are already enforced by the schemas at composition time; this
module checks values, and names the key and the fix in every message. trainer.device and
trainer.precision are checked where they are resolved against the machine
(training/precision.py), the one place that knows them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from optimus_preflight.config.schema import FAIL_ON, MONITOR_MODES, PROGRESS_MODES, STRATEGIES
from optimus_preflight.errors import UserError


@dataclass(frozen=True)
class Rule:
    key: str
    ok: Callable[[Any], bool]
    requirement: str
    fix: str


RULES = (
    Rule("trainer.max_steps", lambda v: v is None or v >= 1, "must be >= 1 or null", "Set trainer.max_steps to the number of optimizer steps to run, e.g. trainer.max_steps=500."),
    Rule("trainer.max_epochs", lambda v: v is None or v >= 1, "must be >= 1 or null", "Set trainer.max_epochs to the number of passes over the training data, e.g. trainer.max_epochs=10, or null."),
    Rule("trainer.early_stopping.mode", lambda v: v in MONITOR_MODES, "must be min or max", "Set trainer.early_stopping.mode=min for a loss, max for an accuracy."),
    Rule("trainer.early_stopping.patience", lambda v: v >= 1, "must be >= 1", "Set trainer.early_stopping.patience=3 (evaluations without improvement before stopping)."),
    Rule("trainer.early_stopping.min_delta", lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0", "Set trainer.early_stopping.min_delta=0."),
    Rule("checkpoint.monitor", lambda v: v is None or str(v).startswith("val_"), "must name an evaluation metric (val_loss, val_<name>) or be null", "Set checkpoint.monitor=val_loss, or val_<name> for a metric your validation_step returns or logs."),
    Rule("trainer.early_stopping.monitor", lambda v: v is None or str(v).startswith("val_"), "must name an evaluation metric (val_loss, val_<name>) or be null", "Set trainer.early_stopping.monitor=val_loss, or val_<name> for a metric your validation_step returns or logs."),
    Rule("checkpoint.mode", lambda v: v in MONITOR_MODES, "must be min or max", "Set checkpoint.mode=min for a loss, max for an accuracy."),
    Rule("scheduler.warmup_steps", lambda v: v is None or v >= 0, "must be >= 0", "Set scheduler.warmup_steps=0 for no warmup."),
    Rule("scheduler.warmup_fraction", lambda v: v is None or 0 <= v < 1, "must be in [0, 1) or null", "Set scheduler.warmup_fraction=0.05 (5% of the run), or null."),
    Rule("scheduler.min_lr_ratio", lambda v: 0 <= v <= 1, "must be in [0, 1]", "Set scheduler.min_lr_ratio=0.1 (the final LR as a fraction of the peak)."),
    Rule("trainer.accumulation_steps", lambda v: v >= 1, "must be >= 1", "Set trainer.accumulation_steps=1 to disable accumulation."),
    Rule("trainer.clip_grad_norm", lambda v: v is None or v > 0, "must be > 0 or null", "Set trainer.clip_grad_norm=1.0, or trainer.clip_grad_norm=null to log the norm without clipping."),
    Rule("trainer.eval_every_n_steps", lambda v: v >= 0, "must be >= 0", "Set trainer.eval_every_n_steps=0 to evaluate only at the end."),
    Rule("trainer.eval_max_batches", lambda v: v is None or v >= 1, "must be >= 1 or null", "Set trainer.eval_max_batches=null to evaluate on the whole validation set."),
    Rule("trainer.max_consecutive_skips", lambda v: v >= 1, "must be >= 1", "Set trainer.max_consecutive_skips=20 (steps with non-finite gradients in a row before the run stops)."),
    Rule("trainer.grad_scaler.init_scale", lambda v: v > 0, "must be > 0", "Set trainer.grad_scaler.init_scale=65536 (torch's default)."),
    Rule("trainer.grad_scaler.growth_factor", lambda v: v > 1, "must be > 1", "Set trainer.grad_scaler.growth_factor=2.0 (torch's default)."),
    Rule("trainer.grad_scaler.backoff_factor", lambda v: 0 < v < 1, "must be between 0 and 1", "Set trainer.grad_scaler.backoff_factor=0.5 (torch's default)."),
    Rule("trainer.grad_scaler.growth_interval", lambda v: v >= 1, "must be >= 1", "Set trainer.grad_scaler.growth_interval=2000 (torch's default)."),
    Rule("trainer.strategy", lambda v: v in STRATEGIES, f"must be one of {'|'.join(STRATEGIES)}", "Set trainer.strategy=ddp (replicate the model) or trainer.strategy=fsdp (shard it)."),
    Rule("trainer.compile_mode", lambda v: v in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"), "must be null, default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs", "Set trainer.compile_mode=null for torch's default."),
    Rule("data.batch_size", lambda v: v >= 1, "must be >= 1", "Set data.batch_size to the micro-batch size per step, e.g. data.batch_size=32."),
    Rule("data.num_workers", lambda v: v >= 0, "must be >= 0", "Set data.num_workers=0 to load data in the main process."),
    Rule("data.prefetch_factor", lambda v: v is None or v >= 1, "must be >= 1 or null", "Set data.prefetch_factor=null to keep torch's default of 2."),
    Rule("data.eval_batch_size", lambda v: v is None or v >= 1, "must be >= 1 or null", "Set data.eval_batch_size=null to use data.batch_size."),
    Rule("optimizer.lr", lambda v: math.isfinite(v) and v > 0, "must be a finite number > 0", "Set optimizer.lr to a positive learning rate, e.g. optimizer.lr=3e-4."),
    # Our optimizer builder moves weight_decay into the parameter groups, where torch does not check it.
    Rule("optimizer.weight_decay", lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0", "Set optimizer.weight_decay=0.1 (or 0 for none)."),
    Rule("logging.every_n_steps", lambda v: v >= 1, "must be >= 1", "Set logging.every_n_steps=10."),
    Rule("logging.progress", lambda v: v in PROGRESS_MODES, f"must be one of {'|'.join(PROGRESS_MODES)}", "Set logging.progress=auto."),
    Rule("logging.dynamics_every_n_steps", lambda v: v >= 0, "must be >= 0", "Set logging.dynamics_every_n_steps=50, or 0 to turn the dynamics metrics and warnings off."),
    Rule("logging.flush_every_s", lambda v: v >= 0, "must be >= 0", "Set logging.flush_every_s=5."),
    Rule("checkpoint.every_n_steps", lambda v: v >= 0, "must be >= 0", "Set checkpoint.every_n_steps=0 to save only at the end."),
    Rule("checkpoint.keep_last", lambda v: v >= 1, "must be >= 1", "Set checkpoint.keep_last=3."),
    Rule("trainer.dist_timeout_s", lambda v: math.isfinite(v) and v > 0, "must be > 0 and finite", "Set trainer.dist_timeout_s=600 (longer than the slowest step or checkpoint save)."),
    Rule("checkpoint.stop_timeout_s", lambda v: math.isfinite(v) and v > 0, "must be > 0 and finite", "Set checkpoint.stop_timeout_s=60 (longer than one training step)."),
    Rule("preflight.fail_on", lambda v: v in FAIL_ON, f"must be one of {'|'.join(FAIL_ON)}", "Set preflight.fail_on=error."),
    Rule("preflight.first_batch_timeout_s", lambda v: v > 0, "must be > 0", "Set preflight.first_batch_timeout_s=300."),
    Rule("preflight.overfit_steps", lambda v: v >= 0, "must be >= 0", "Set preflight.overfit_steps=0 to skip the overfit smoke test."),
    Rule("preflight.memory.target_gib", lambda v: v is None or v > 0, "must be > 0 or null", "Set preflight.memory.target_gib=80 for an 80 GiB GPU, or null to check the local device."),
    Rule("preflight.memory.world_size", lambda v: v is None or v >= 1, "must be >= 1 or null", "Set preflight.memory.world_size=8 to check one rank of 8 sharding the model (FSDP), or null."),
    Rule("preflight.memory.usable_fraction", lambda v: 0 < v <= 1, "must be in (0, 1]", "Set preflight.memory.usable_fraction=0.95."),
)


def _lookup(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    value = OmegaConf.select(cfg, key, default=_MISSING, throw_on_missing=False)
    return value is not _MISSING, value


_MISSING = object()


def validate_config(cfg: DictConfig) -> None:
    """Raise UserError for the first invalid value."""
    if OmegaConf.select(cfg, "trainer.max_steps") is None and OmegaConf.select(cfg, "trainer.max_epochs") is None:
        raise UserError("neither trainer.max_steps nor trainer.max_epochs is set: the run would never end",
                        key="trainer.max_steps",
                        fix="Set trainer.max_steps=1000 (optimizer steps) or trainer.max_epochs=10 (passes over the data).")
    for rule in RULES:
        present, value = _lookup(cfg, rule.key)
        if not present:
            continue  # a user recipe may replace a group (e.g. an optimizer without lr)
        if not rule.ok(value):
            raise UserError(f"{rule.key} {rule.requirement}, got {value!r}.", key=rule.key, fix=rule.fix)
