"""Compose the same config the CLI builds, and turn composition errors into UserErrors."""

from __future__ import annotations

import contextlib
import difflib
import os
from dataclasses import dataclass
from typing import Iterator, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from optimus_preflight.config.invocation import program
from optimus_preflight.config.recipe_config import is_generated_option, recipe_overrides, selecting_overrides
from optimus_preflight.config.registration import register_configs
from optimus_preflight.config.validate import validate_config
from optimus_preflight.errors import UserError

CONFIG_MODULE = "optimus_preflight.conf"
CONFIG_NAME = "config"


@dataclass(frozen=True)
class ConfigSource:
    """Where Hydra looks for configs besides this package, as on Hydra's command line:
    ``--config-dir`` adds a directory to the search path (a user's own presets), and
    ``--config-path``/``--config-name`` replace the primary config."""

    config_dir: str | None = None
    config_path: str | None = None
    config_name: str | None = None

    def searchpath_overrides(self, overrides: Sequence[str]) -> list[str]:
        """``--config-dir DIR`` as the ``hydra.searchpath`` entry Hydra's own app adds."""
        if not self.config_dir:
            return list(overrides)
        entry = f"file://{os.path.abspath(self.config_dir)}"
        result, merged = [], False
        for override in overrides:
            key, _, value = override.partition("=")
            if key.lstrip("+") == "hydra.searchpath" and value.strip().startswith("["):
                inner = value.strip()[1:-1].strip()
                override = f"{key}=[{inner + ',' if inner else ''}{entry}]"
                merged = True
            result.append(override)
        return result if merged else [*result, f"hydra.searchpath=[{entry}]"]


DEFAULT_SOURCE = ConfigSource()


@contextlib.contextmanager
def _private_hydra(source: ConfigSource = DEFAULT_SOURCE) -> Iterator[None]:
    """Compose even inside a running Hydra app, leaving its global state as it was."""
    from hydra.core.singleton import Singleton

    saved = Singleton._instances.pop(GlobalHydra, None)
    try:
        if source.config_path:
            with initialize_config_dir(os.path.abspath(source.config_path), version_base="1.3"):
                yield
        else:
            with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
                yield
    finally:
        if saved is not None:
            Singleton._instances[GlobalHydra] = saved


def _all_keys(cfg: DictConfig) -> list[str]:
    keys: list[str] = []

    def walk(node, prefix: str) -> None:
        for key in node.keys() if isinstance(node, DictConfig) else ():
            path = f"{prefix}{key}"
            keys.append(path)
            value = node._get_node(key)
            if isinstance(value, DictConfig):
                walk(value, path + ".")

    walk(cfg, "")
    return keys


def _override_key(text: str) -> str:
    return text.lstrip("+~").split("=", 1)[0]


def _offending_override(error: Exception, overrides: Sequence[str]) -> str | None:
    message = str(error)
    for override in overrides:
        if override in message or f"'{_override_key(override)}'" in message:
            return override
    return None


def _missing_option_error(error: MissingConfigException, key: str | None) -> UserError:
    text = str(error)
    head = text.split("Available options")[0].strip()
    options: list[str] = []
    if "Available options" in text:
        listing = text.split("Available options", 1)[1].split("Config search path")[0]
        # Schemas are registered beside the YAML options; they are not meant to be picked.
        options = [line.strip() for line in listing.splitlines()[1:]
                   if line.strip() and not line.strip().endswith("_schema") and not is_generated_option(line.strip())]
    fix = f"Available options: {', '.join(options)}." if options else "Check the group and option names."
    return UserError(" ".join(head.split()), key=key, fix=fix)


def _not_a_list_error(key: str, value: str) -> UserError:
    """``key=a`` where the schema declares a list: show the bracket syntax with the user's value."""
    items = value.strip().strip("'\"")
    return UserError(
        f"{key} takes a list, got {value!r}",
        key=key,
        fix=f"Write it in brackets: {key}=[{items}] (several items: {key}=[a,b]; none: {key}=[]).",
    )


def config_error(error: Exception, overrides: Sequence[str], source: ConfigSource = DEFAULT_SOURCE) -> UserError:
    """One readable message naming the key and the fix, for any composition error."""
    cause = error if isinstance(error, OmegaConfBaseException) else error.__cause__
    override = _offending_override(error, overrides)
    key = getattr(cause, "full_key", None) or (_override_key(override) if override else None)
    if isinstance(error, MissingConfigException):
        return _missing_option_error(error, key)
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        suggestion = ""
        if key:
            with contextlib.suppress(Exception):
                # The keys of the same recipe's config: every override but the offending one.
                others = [o for o in overrides if o != override]
                with _private_hydra(source):
                    known = _all_keys(hydra_compose(source.config_name or CONFIG_NAME, overrides=source.searchpath_overrides(others)))
                close = difflib.get_close_matches(key, known, n=1)
                suggestion = f"Did you mean {close[0]}? " if close else ""
        return UserError(
            f"unknown config key {key!r}",
            key=key,
            fix=f"{suggestion}Run with --cfg job (or --help) to list every key; prefix an override "
            "with + only to add a new key on purpose.",
        )
    if isinstance(cause, ValidationError):
        reason = str(cause).splitlines()[0]
        if key and override and "is not a ListConfig" in reason:
            return _not_a_list_error(key, override.split("=", 1)[1])
        return UserError(
            f"invalid value for {key}: {reason}",
            key=key,
            fix=f"Pass a value of the type the schema declares (see `{program()} --cfg job`).",
        )
    reason = " ".join(str(error).split())
    if cause is not None and str(cause).strip() and str(cause).splitlines()[0] not in reason:
        reason = f"{reason} ({str(cause).splitlines()[0]})"
    return UserError(reason, key=key, fix="Check the override syntax: key=value, +key=value to add a key.")


def _hydra_compose(overrides: Sequence[str], source: ConfigSource) -> DictConfig:
    with _private_hydra(source):
        return hydra_compose(source.config_name or CONFIG_NAME, overrides=source.searchpath_overrides(overrides))


def recipe_class_of(cfg: DictConfig) -> type | None:
    """The class a config's ``recipe._target_`` names (imported), or None without one."""
    from optimus_preflight.config.instantiate import locate

    target = OmegaConf.select(cfg, "recipe._target_", default=None)
    if not isinstance(target, str) or not target:
        return None
    recipe_class = locate(target, "recipe._target_")
    return recipe_class if isinstance(recipe_class, type) else None


def declared_overrides(overrides: Sequence[str], source: ConfigSource = DEFAULT_SOURCE) -> list[str]:
    """The overrides that select the recipe class's own config (its ``model_config``,
    ``data_config`` and defaults; recipe_config.py), to add to ``overrides``.

    The class is found from a first composition with only the overrides that select the
    recipe, and neither model nor data options: a preset may set keys only the
    recipe's own schema has."""
    selecting = [*selecting_overrides(overrides), "model=none", "data=none"]
    try:
        first = _hydra_compose(selecting, source)
    except (HydraException, OmegaConfBaseException, ValueError):
        return []  # the full composition reports it, naming the override
    recipe_class = recipe_class_of(first)
    return recipe_overrides(recipe_class, overrides) if recipe_class is not None else []


def compose(overrides: list[str] | None = None, *, recipe: type | None = None,
            source: ConfigSource = DEFAULT_SOURCE) -> DictConfig:
    """The config ``optimus-train <overrides>`` would build, validated (raises UserError).

    ``recipe``: compose for this class (as ``recipe._target_=...`` would), with the
    model, data and defaults it declares."""
    overrides = list(overrides or [])
    register_configs()
    if recipe is not None and not any(o.lstrip("+").startswith("recipe._target_=") for o in overrides):
        overrides.append(f"recipe._target_={recipe.__module__}.{recipe.__qualname__}")
    # The app adds (and registers) them before composing each job: done once, not again.
    if not any(is_generated_option(o.partition("=")[2]) for o in overrides):
        overrides += declared_overrides(overrides, source)
    try:
        cfg = _hydra_compose(overrides, source)
    except (HydraException, OmegaConfBaseException, ValueError) as error:
        raise config_error(error, overrides, source) from None
    validate_config(cfg)
    OmegaConf.set_readonly(cfg, False)
    return cfg
