"""Compose the same config the CLI builds, and turn composition errors into UserErrors."""

from __future__ import annotations

import contextlib
import difflib
from typing import Iterator, Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from optimus_preflight.config.registration import register_configs
from optimus_preflight.config.validate import validate_config
from optimus_preflight.errors import UserError

CONFIG_MODULE = "optimus_preflight.conf"
CONFIG_NAME = "config"


@contextlib.contextmanager
def _private_hydra() -> Iterator[None]:
    """Compose even inside a running Hydra app, leaving its global state as it was."""
    from hydra.core.singleton import Singleton

    saved = Singleton._instances.pop(GlobalHydra, None)
    try:
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
        options = [line.strip() for line in listing.splitlines()[1:] if line.strip() and not line.strip().endswith("_schema")]
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


def config_error(error: Exception, overrides: Sequence[str]) -> UserError:
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
                with _private_hydra():
                    known = _all_keys(hydra_compose(CONFIG_NAME))
                close = difflib.get_close_matches(key, known, n=1)
                suggestion = f"Did you mean {close[0]}? " if close else ""
        return UserError(
            f"unknown config key {key!r}",
            key=key,
            fix=f"{suggestion}Run `optimus-train --cfg job` to list every key; prefix an override "
            "with + only to add a new key on purpose.",
        )
    if isinstance(cause, ValidationError):
        reason = str(cause).splitlines()[0]
        if key and override and "is not a ListConfig" in reason:
            return _not_a_list_error(key, override.split("=", 1)[1])
        return UserError(
            f"invalid value for {key}: {reason}",
            key=key,
            fix="Pass a value of the type the schema declares (see `optimus-train --cfg job`).",
        )
    reason = " ".join(str(error).split())
    if cause is not None and str(cause).strip() and str(cause).splitlines()[0] not in reason:
        reason = f"{reason} ({str(cause).splitlines()[0]})"
    return UserError(reason, key=key, fix="Check the override syntax: key=value, +key=value to add a key.")


def compose(overrides: list[str] | None = None) -> DictConfig:
    """The config ``optimus-train <overrides>`` would build, validated (raises UserError)."""
    overrides = list(overrides or [])
    register_configs()
    try:
        with _private_hydra():
            cfg = hydra_compose(CONFIG_NAME, overrides=overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as error:
        raise config_error(error, overrides) from None
    validate_config(cfg)
    OmegaConf.set_readonly(cfg, False)
    return cfg
