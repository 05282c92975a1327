"""What each mixin needs from the recipe it is composed into.

A mixin reads only what its contract lists (the recipe's own config, objects and
hooks), and receives what another mixin owns (the training context, the batch stream)
as an argument from the recipe, never by reading that mixin's attribute: the order of
``setup`` is then written in the recipe, not hidden in attribute lookups. The contract
test (tests/test_mixin_contracts.py) checks every mixin against these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from omegaconf import DictConfig
from torch import nn
from torch.optim import Optimizer

from optimus_preflight.training.run_state import RunState


@runtime_checkable
class ConfiguredHost(Protocol):
    """TrainingContextMixin's host: the composed config."""

    cfg: DictConfig


@runtime_checkable
class IterationHost(Protocol):
    """TrainingIterationMixin's host: the config and the objects a step runs on."""

    cfg: DictConfig
    model: nn.Module
    optimizer: Optimizer
    scheduler: Any

    def compute_loss(self, model: nn.Module, batch: Any) -> Any: ...


@runtime_checkable
class InterruptionHost(Protocol):
    """TrainingInterruptionMixin's host: the config, the run dir and state, and what a
    forced exit writes (summary.json, without hashing weights that may be mid-update)."""

    cfg: DictConfig
    run_dir: Path
    state: RunState

    def write_forced_summary(self, status: str) -> object: ...


@runtime_checkable
class PreflightHost(Protocol):
    """PreflightMixin's host: set-up, and the context the checks look at."""

    cfg: DictConfig

    def setup(self) -> None: ...

    def preflight_context(self) -> Any: ...
