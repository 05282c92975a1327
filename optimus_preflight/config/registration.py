"""Registers the schemas in Hydra's ConfigStore: each YAML group extends its schema.

Recipes register the schemas of their own model and data nodes through the
``optimus_preflight.schemas`` entry point group (a function taking the ConfigStore), so
the library names no concrete recipe; the shipped char-LM registers itself that way in
pyproject.toml, and a user's package can do the same."""

from __future__ import annotations

from importlib.metadata import entry_points

from hydra.core.config_store import ConfigStore

from optimus_preflight.config import schema

SCHEMA_ENTRY_POINTS = "optimus_preflight.schemas"

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


def group_schemas() -> dict[str, type]:
    """The schema of each group that has one (for ``--help``'s field docs)."""
    schemas: dict[str, type] = {"recipe": schema.RecipeConfig}
    for (group, _name), node in _GROUP_SCHEMAS.items():
        schemas.setdefault(group, node)
    return schemas


def register_configs() -> None:
    global _registered
    if _registered:
        return
    store = ConfigStore.instance()
    store.store(name="base_config", node=schema.Config)
    for (group, name), node in _GROUP_SCHEMAS.items():
        store.store(group=group, name=name, node=node)
    for entry in entry_points(group=SCHEMA_ENTRY_POINTS):
        entry.load()(store)
    _registered = True
