"""Warnings when a training dial leaves its healthy band for a sustained window.

A rule watches one metric (or every metric under a prefix, e.g. each
``update_ratio/<group>``). A subject that is out of band for ``patience``
observations in a row opens an episode: one warning, naming the likely cause and the
config key to turn. The episode closes at the first in-band observation; only a new
episode warns again, so a run that stays broken is not flooded with the same line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

# Bands. The update/weight ratio is healthy near 1e-3 (CS231n); two decades either
# side is "far". The scale floor: 12 halvings below torch's 65536 default.
UPDATE_RATIO_LOW = 1e-5
UPDATE_RATIO_HIGH = 1e-1
SCALE_FLOOR = 16.0
DEAD_FRACTION_HIGH = 0.9
SKIP_RATE_HIGH = 0.5
PATIENCE = 3


@dataclass(frozen=True)
class Rule:
    code: str
    metric: str  # a metric name, or a prefix ending in "/" matching one subject per key
    unhealthy: Callable[[float], bool]
    describe: Callable[[str, float], str]  # (subject, value) -> what is wrong
    cause: str
    fix: str
    key: str


@dataclass
class DynamicsWarning:
    step: int
    code: str
    metric: str
    value: float
    message: str
    fix: str
    key: str

    def to_dict(self) -> dict[str, Any]:
        value = self.value if math.isfinite(self.value) else str(self.value)
        return {"step": self.step, "code": self.code, "metric": self.metric, "value": value, "message": self.message, "fix": self.fix, "config_key": self.key}

    def line(self) -> str:
        return f"[{self.code}] step {self.step}: {self.message} Fix: {self.fix}"


def default_rules(precision: str = "fp32") -> list[Rule]:
    overflow = precision == "fp16"
    blowup_cause = (
        "fp16 overflow: values above 65504 in the forward or backward"
        if overflow
        else "a learning rate too high for the model, or inf/NaN in the data"
    )
    blowup_fix = (
        "Set trainer.precision=bf16 (fp32's exponent range), or lower optimizer.lr."
        if overflow
        else "Lower optimizer.lr (or lengthen scheduler.warmup_steps), keep trainer.clip_grad_norm set, and check the data for inf/NaN."
    )
    return [
        Rule(
            "O22_LOW",
            "update_ratio/",
            lambda v: v < UPDATE_RATIO_LOW,
            lambda group, v: f"update/weight ratio of parameter group '{group}' is {v:.1e}, below {UPDATE_RATIO_LOW:.0e} (healthy ~1e-3).",
            "the learning rate is far too low: each step barely moves the weights and the loss crawls (O7).",
            "Raise optimizer.lr (10-100x); preflight.lr_finder=true suggests a value.",
            "optimizer.lr",
        ),
        Rule(
            "O22_HIGH",
            "update_ratio/",
            lambda v: v > UPDATE_RATIO_HIGH,
            lambda group, v: f"update/weight ratio of parameter group '{group}' is {v:.1e}, above {UPDATE_RATIO_HIGH:.0e} (healthy ~1e-3).",
            "the learning rate is too high: every step rewrites over a tenth of the weights, so training is noisy or diverges.",
            "Lower optimizer.lr, or lengthen scheduler.warmup_steps.",
            "optimizer.lr",
        ),
        Rule(
            "O24",
            "grad_scale",
            lambda v: v < SCALE_FLOOR,
            lambda _, v: f"the GradScaler scale has collapsed to {v:g} (healthy: 2^13-2^16 after calibration).",
            "persistent fp16 overflow: the scaler keeps halving and skipping steps, so the weights barely train.",
            "Set trainer.precision=bf16, or keep the overflowing block (logits, attention) in fp32; lowering trainer.grad_scaler.init_scale does not help.",
            "trainer.precision",
        ),
        Rule(
            "O24_SKIPS",
            "skip_rate",
            lambda v: v > SKIP_RATE_HIGH,
            lambda _, v: f"{v:.0%} of the optimizer steps since the last measurement were skipped for non-finite gradients.",
            blowup_cause + ".",
            blowup_fix,
            "trainer.precision" if overflow else "optimizer.lr",
        ),
        Rule(
            "O25",
            "dead_fraction/",
            lambda v: v > DEAD_FRACTION_HIGH,
            lambda layer, v: f"activation layer '{layer}' outputs zero for {v:.0%} of its inputs (over {DEAD_FRACTION_HIGH:.0%}).",
            "dying ReLUs: a large update (too-high LR) or a large negative bias pushed the pre-activations below zero, where no gradient flows back.",
            "Lower optimizer.lr; use LeakyReLU/GELU/SiLU in the model; check the layer's init and bias.",
            "optimizer.lr",
        ),
        Rule(
            "LOSS_NAN",
            "loss",
            lambda v: not math.isfinite(v),
            lambda _, v: f"the training loss is {v}.",
            blowup_cause + ".",
            blowup_fix,
            "trainer.precision" if overflow else "optimizer.lr",
        ),
    ]


class Watchdog:
    def __init__(self, rules: list[Rule] | None = None, patience: int = PATIENCE):
        self.rules = rules if rules is not None else default_rules()
        self.patience = patience
        # (code, metric key) -> consecutive out-of-band observations; and open episodes.
        self._streaks: dict[tuple[str, str], int] = {}
        self._open: set[tuple[str, str]] = set()

    def observe(self, step: int, metrics: dict[str, Any]) -> list[DynamicsWarning]:
        """Feed one observation of some metrics; returns the warnings of newly opened episodes."""
        warnings = []
        for rule in self.rules:
            for metric, value in metrics.items():
                subject = _subject(rule.metric, metric)
                if subject is None or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                slot = (rule.code, metric)
                if not rule.unhealthy(float(value)):
                    self._streaks.pop(slot, None)
                    self._open.discard(slot)
                    continue
                self._streaks[slot] = self._streaks.get(slot, 0) + 1
                if self._streaks[slot] >= self.patience and slot not in self._open:
                    self._open.add(slot)
                    seen = f" Seen in {self._streaks[slot]} measurements in a row." if self.patience > 1 else ""
                    message = f"{rule.describe(subject, float(value))}{seen} Likely cause: {rule.cause}"
                    warnings.append(DynamicsWarning(step, rule.code, metric, float(value), message, rule.fix, rule.key))
        return warnings


def _subject(pattern: str, metric: str) -> str | None:
    if pattern.endswith("/"):
        return metric[len(pattern) :] if metric.startswith(pattern) else None
    return metric if metric == pattern else None
