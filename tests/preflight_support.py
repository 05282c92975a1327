"""Helpers for the preflight tests: tiny recipes with one deliberate defect each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.framework import CheckResult, CheckStatus, run_checks
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.issues import FRAMEWORK_CODES
from optimus_preflight.recipe import TrainRecipe
from optimus_preflight.training.loaders import build_loader
from tests.conftest import tiny_config

CLASSES = 4
FEATURES = 8


def classification_data(samples: int = 64, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, torch.randint(0, CLASSES, (samples,), generator=generator))


def classifier() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def make_recipe(
    tmp_path: Path,
    *overrides: str,
    model: Callable[[], nn.Module] | None = None,
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    loss: Callable[[nn.Module, Any], Any] | None = None,
    dataset: Any = None,
    loader: Callable[[Any], DataLoader] | None = None,
    classification: bool = True,
) -> TrainRecipe:
    """A set-up recipe. ``classification`` swaps the char-LM for a small classifier on
    random features (fast, and its head size is known); each keyword replaces a builder."""
    from optimus_preflight.recipes.char_lm import CharLMRecipe

    base = TrainRecipe if classification else CharLMRecipe
    namespace: dict[str, Any] = {}
    if classification or model:
        namespace["build_model"] = lambda self: (model or classifier)()
    if optimizer:
        namespace["build_optimizer"] = lambda self, m: optimizer(m)
    if scheduler:
        namespace["build_scheduler"] = lambda self, opt: scheduler(opt)
    if loss:
        namespace["compute_loss"] = lambda self, m, batch: loss(m, batch)
    if classification or dataset is not None or loader:
        def build_dataloaders(self):
            data = dataset if dataset is not None else classification_data()
            if loader is not None:
                return loader(data), None
            return build_loader(data, self.cfg.data, train=True, seed=0), None

        namespace["build_dataloaders"] = build_dataloaders
    recipe_class = type("TestRecipe", (base,), namespace)
    defaults = ["data.batch_size=16", "trainer.max_steps=8", "scheduler.warmup_steps=2"] if classification else []
    recipe = recipe_class(tiny_config(*defaults, *overrides), run_dir=tmp_path / "run")
    recipe.setup()
    return recipe


def run(recipe_or_ctx: Any, *check_classes: type) -> dict[str, CheckResult]:
    """Run checks (with the first batch and first step they may need) and index by name."""
    ctx = recipe_or_ctx if isinstance(recipe_or_ctx, PreflightContext) else PreflightContext.from_recipe(recipe_or_ctx)
    needed = {name for cls in check_classes for name in cls.requires}
    prerequisites = [cls for cls in (FirstBatchCheck, FirstStepCheck) if cls.name in needed and cls not in check_classes]
    if FirstStepCheck in prerequisites and FirstBatchCheck not in check_classes:
        prerequisites = [FirstBatchCheck, FirstStepCheck]
    classes = (*prerequisites, *check_classes)
    results = run_checks([cls() for cls in classes], ctx, ctx.cfg.preflight.disable)
    declared_by = {cls.name: cls.codes for cls in classes}
    for result in results:
        # preflight.disable validates against the declared codes: a code reported but not
        # declared could not be disabled.
        undeclared = codes(result) - set(declared_by[result.name]) - set(FRAMEWORK_CODES)
        assert not undeclared, f"{result.name} reports codes it does not declare: {sorted(undeclared)}"
    return {result.name: result for result in results}


def codes(result: CheckResult) -> set[str]:
    return {issue.code for issue in result.issues}


def assert_quiet(result: CheckResult) -> None:
    assert result.status == CheckStatus.PASSED, (result.status, result.detail, [i.message for i in result.issues])
    assert not [i for i in result.issues if i.severity.value != "info"]
