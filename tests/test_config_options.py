"""Every YAML option under optimus_preflight/conf/ composes into a valid config, and the library's import
graph keeps its layers: no cycle between the CLI and the recipe, no concrete recipe
imported by the library."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from omegaconf import OmegaConf

from optimus_preflight import compose
from optimus_preflight.config.compose import _private_hydra
from optimus_preflight.config.registration import register_configs
from tests.conftest import REPO

CONF = REPO / "optimus_preflight" / "conf"
PACKAGE = REPO / "optimus_preflight"
HYDRA_GROUPS = "hydra"


def _options(root: Path) -> list[tuple[str, str]]:
    return sorted(
        (path.parent.relative_to(root).as_posix(), path.stem)
        for path in root.rglob("*.yaml")
        if path.parent != root
    )


OPTIONS = _options(CONF)


def test_every_group_under_conf_is_found():
    groups = {group for group, _ in OPTIONS}
    assert {"model", "data", "optimizer", "scheduler", "trainer", "recipe", "hydra/launcher"} <= groups


@pytest.mark.parametrize(("group", "option"), [o for o in OPTIONS if not o[0].startswith(HYDRA_GROUPS)],
                         ids="=".join)
def test_each_option_composes_into_a_valid_config(group, option):
    # The generic data options carry no corpus for the default recipe's model to follow.
    extra = ["model=none"] if group == "data" and option in ("default", "none") else []
    cfg = compose([f"{group}={option}", *extra])  # validates too: a broken option raises UserError
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


@pytest.mark.parametrize(("group", "option"), [o for o in OPTIONS if o[0].startswith(HYDRA_GROUPS)],
                         ids="=".join)
def test_each_hydra_option_composes_and_names_an_importable_target(group, option):
    register_configs()
    with _private_hydra():
        cfg = hydra_compose("config", overrides=[f"{group}={option}"], return_hydra_config=True)
    node = OmegaConf.select(cfg, group.replace("/", "."))
    assert node is not None
    target = OmegaConf.select(node, "_target_") if OmegaConf.is_dict(node) else None
    if target:
        module, _, name = target.rpartition(".")
        assert hasattr(importlib.import_module(module), name), target


def test_the_sweep_callback_target_imports():
    register_configs()
    with _private_hydra():
        cfg = hydra_compose("config", return_hydra_config=True)
    for callback in cfg.hydra.callbacks.values():
        module, _, name = callback._target_.rpartition(".")
        assert hasattr(importlib.import_module(module), name)


# ------------------------------------------------------------------ import graph


def _imports(path: Path) -> set[str]:
    """Modules a file imports at any level (inside functions too: a cycle is a cycle)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


LIBRARY = {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}


def _reaches(start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module in seen:
            continue
        seen.add(module)
        todo += [name for name in LIBRARY.get(module, ()) if name in LIBRARY]
    return False


def test_the_recipe_does_not_reach_the_cli_and_the_app_does_not_reach_the_recipe():
    assert not _reaches("optimus_preflight.recipe", "optimus_preflight.cli")
    assert not _reaches("optimus_preflight.app", "optimus_preflight.recipe")
    assert not _reaches("optimus_preflight.app", "optimus_preflight.cli")


def test_the_library_imports_no_concrete_recipe():
    """Recipes plug in through the ``optimus_preflight.schemas`` entry point and
    ``recipe._target_``; the library never names one."""
    offenders = {module: sorted(name for name in names if name.startswith(("optimus_preflight.recipes", "recipes")))
                 for module, names in LIBRARY.items() if not module.startswith("optimus_preflight.recipes")}
    assert not {module: names for module, names in offenders.items() if names}


# Lowest first; a module may import its own layer and the layers before it. The package's
# __init__ sits on top; conf/ holds YAML (its __init__ imports nothing).
LAYERS = ["errors", "config", "training", "reporting", "callbacks", "plotting", "checkpoint", "memory", "dynamics",
          "preflight", "integrations", "mixins", "app", "recipe", "cli", "recipes", "compat"]
TOP = {"__init__", "conf"}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_module_belongs_to_a_layer():
    assert {_layer(module) for module in LIBRARY} <= set(LAYERS) | TOP


def test_the_layers_import_downwards_only():
    """The tree is a picture of the architecture: no layer reaches one above it."""
    upward = []
    for module, names in LIBRARY.items():
        if _layer(module) in TOP:
            continue
        rank = LAYERS.index(_layer(module))
        upward += [f"{module} -> {name}" for name in names
                   if name in LIBRARY and _layer(name) not in TOP and LAYERS.index(_layer(name)) > rank]
    assert not upward
