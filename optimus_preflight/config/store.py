"""Registers the schemas in Hydra's ConfigStore: each YAML group extends its schema."""

from __future__ import annotations

import importlib

from hydra.core.config_store import ConfigStore

from optimus_preflight.config import schema

# Recipes shipped with the package register the schemas of their own model/data nodes.
SHIPPED_RECIPE_MODULES = ("optimus_preflight.recipes.char_lm",)

_GROUP_SCHEMAS = {
    ("trainer", "trainer_schema"): schema.TrainerConfig,
    ("data", "data_schema"): schema.DataConfig,
    ("logging", "logging_schema"): schema.LoggingConfig,
    ("preflight", "preflight_schema"): schema.PreflightConfig,
    ("checkpoint", "checkpoint_schema"): schema.CheckpointConfig,
    ("sweep", "sweep_schema"): schema.SweepConfig,
    ("optimizer", "adamw_schema"): schema.AdamWConfig,
    ("optimizer", "sgd_schema"): schema.SGDConfig,
    ("scheduler", "warmup_cosine_schema"): schema.WarmupCosineConfig,
    ("scheduler", "constant_schema"): schema.ConstantLRConfig,
}

_registered = False


def register_configs() -> None:
    global _registered
    if _registered:
        return
    store = ConfigStore.instance()
    store.store(name="base_config", node=schema.Config)
    for (group, name), node in _GROUP_SCHEMAS.items():
        store.store(group=group, name=name, node=node)
    for module in SHIPPED_RECIPE_MODULES:
        importlib.import_module(module).register_schemas(store)
    _registered = True
