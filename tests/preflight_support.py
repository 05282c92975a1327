"""Helpers for the preflight tests: tiny recipes with one deliberate defect each."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from optimus_preflight.config.instantiate import instantiate_node
from optimus_preflight.preflight.checks.data_checks import FirstBatchCheck
from optimus_preflight.preflight.checks.step_checks import FirstStepCheck
from optimus_preflight.preflight.framework import CheckResult, CheckStatus, run_checks
from optimus_preflight.preflight.framework.context import PreflightContext
from optimus_preflight.preflight.framework.issues import FRAMEWORK_CODES
from optimus_preflight.recipe import TrainRecipe
from optimus_preflight.training.load_report import recording_loads
from optimus_preflight.training.loaders import build_loader
from optimus_preflight.training.optim import build_optimizer
from optimus_preflight.training.run_length import optimizer_steps_per_epoch, planned_max_steps
from optimus_preflight.training.strategy import place_model
from optimus_preflight.training.training_context import build_training_context
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
    defaults = list(CLASSIFICATION_DEFAULTS) if classification else []
    recipe = recipe_class(tiny_config(*defaults, *overrides), run_dir=tmp_path / "run")
    recipe.setup()
    return recipe


CLASSIFICATION_DEFAULTS = ("data.batch_size=16", "trainer.max_steps=8", "scheduler.warmup_steps=2")


@functools.cache
def _composed(groups: tuple[str, ...]) -> DictConfig:
    return tiny_config(*CLASSIFICATION_DEFAULTS, *groups)


def plain_config(*overrides: str) -> DictConfig:
    """``make_recipe``'s config without a Hydra compose per test: composed once per set of
    group choices and additions (``optimizer=sgd``, ``+model.lora=...``), the key
    overrides merged in (type-checked by the schema, unknown keys refused as compose would)."""
    groups = tuple(item for item in overrides if item.startswith(("+", "~")) or "." not in item.split("=", 1)[0])
    cfg = copy.deepcopy(_composed(groups))
    values = [item for item in overrides if item not in groups]
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist(values)) if values else cfg


def classification_loss(model: nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``TrainRecipe.compute_loss``: cross-entropy, with the count of targets it averages."""
    inputs, targets = batch
    loss = F.cross_entropy(model(inputs).flatten(0, -2), targets.flatten(), ignore_index=-100)
    return loss, (targets != -100).sum()


def plain_context(
    tmp_path: Path,
    *overrides: str,
    model: Callable[[], nn.Module] | None = None,
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
    loss: Callable[[nn.Module, Any], Any] | None = None,
    dataset: Any = None,
    loader: Callable[[Any], DataLoader] | None = None,
) -> PreflightContext:
    """``make_recipe``'s objects, built as the recipe's default builders build them, in a
    context from plain objects: no recipe, run-dir lock or signal handlers. Every config
    key applies (a recipe overriding a builder would say otherwise: those tests keep
    ``make_recipe``)."""
    cfg = plain_config(*overrides)
    training = build_training_context(cfg.trainer)  # seeds, as the recipe's setup does
    with recording_loads():
        built = (model or classifier)()
    built, _ = place_model(built, cfg.trainer, training)
    opt = optimizer(built) if optimizer else build_optimizer(OmegaConf.to_container(cfg.optimizer, resolve=True), built)
    data = dataset if dataset is not None else classification_data()
    train_loader = loader(data) if loader is not None else build_loader(data, cfg.data, train=True, seed=0)
    steps_per_epoch = optimizer_steps_per_epoch(train_loader, cfg.trainer.accumulation_steps)
    cfg.trainer.max_steps = planned_max_steps(cfg.trainer.max_steps, cfg.trainer.max_epochs, steps_per_epoch)
    sched = scheduler(opt) if scheduler else _default_scheduler(cfg, opt)
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return PreflightContext.from_objects(cfg, built, opt, train_loader, loss or classification_loss, run_dir=run_dir,
                                         scheduler=sched, training=training)


def _default_scheduler(cfg: DictConfig, optimizer: torch.optim.Optimizer) -> Any:
    """``TrainRecipe.build_scheduler``."""
    node = cfg.scheduler
    if node is None or len(node) == 0:
        return None
    extra: dict[str, Any] = {"optimizer": optimizer}
    if "total_steps" in node and node.total_steps is None:
        extra["total_steps"] = cfg.trainer.max_steps
    return instantiate_node(node, "scheduler", **extra)


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
