"""A recipe class declares its own config; this module turns the declaration into Hydra
config options, so the CLI, ``compose`` and ``--cfg job`` all see the recipe's keys.

A recipe class may set (all optional, inherited like any class attribute):

- ``model_config`` / ``data_config``: a dataclass type whose fields (and defaults) are the
  ``model`` / ``data`` group, or the name of an option of that group (a YAML file).
- ``config_defaults``: a mapping from a group (``trainer``, ``optimizer``, ``scheduler``,
  ``logging``, ``checkpoint``, ``preflight``) to the values the recipe wants by default;
  a string instead of a mapping picks that group's option (``{"scheduler": "warmup_cosine"}``),
  an ``(option, values)`` pair picks it with the recipe's values (which then apply to that
  option only: ``optimizer=sgd`` on the command line gets SGD's own defaults), and a dotted
  key sets one value (``{"trainer.max_steps": 400}``).
- ``trainer_defaults``: shorthand for ``config_defaults["trainer"]``.

Priority, lowest first: the schemas' defaults, the recipe class's declarations, a recipe
preset YAML (``recipe=NAME``), the command line.

Composition runs twice when a class declares anything: once with only the overrides that
select the recipe (to learn which class it is), then with the options generated here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Sequence

from hydra.core.config_store import ConfigStore

from optimus_preflight.errors import UserError

DEFAULTS_GROUP = "recipe_defaults"
_CHOICE_GROUPS = ("model", "data", "optimizer", "scheduler")
_VALUE_GROUPS = ("trainer", "optimizer", "scheduler", "logging", "checkpoint", "preflight", "sweep", "data", "model")


def option_name(recipe_class: type) -> str:
    """The generated options' name: readable in ``hydra.runtime.choices`` and unique per class."""
    return f"{recipe_class.__module__}.{recipe_class.__qualname__}".replace(".", "_")


def _group_node(declared: Any, group: str, recipe_class: type) -> tuple[str | None, Any]:
    """(option name to select, node to register or None)."""
    if declared is None:
        return None, None
    if isinstance(declared, str):
        # An alias of the option under the class's name: what the app adds is then never
        # a choice a user could have typed (is_generated_override).
        return option_name(recipe_class), {"defaults": [declared, "_self_"]}
    if isinstance(declared, type) and dataclasses.is_dataclass(declared):
        return option_name(recipe_class), declared
    raise UserError(
        f"{recipe_class.__qualname__}.{group}_config must be a dataclass type or the name of a {group} option, got {declared!r}",
        key=f"{group}",
        fix=f"Declare it as `{group}_config = My{group.title()}Config` where My{group.title()}Config is a @dataclass.",
    )


def _derived_option(group: str, option: str, values: Mapping[str, Any], recipe_class: type) -> str:
    """An option of ``group`` that is ``option`` with the recipe's values: picking another
    option on the command line leaves them behind."""
    name = f"{option_name(recipe_class)}_{option}"
    ConfigStore.instance().store(group=group, name=name, node={"defaults": [option, "_self_"], **dict(values)})
    _generated_options.add(name)
    return name


def _defaults_node(recipe_class: type) -> dict[str, Any] | None:
    """The recipe's ``config_defaults``/``trainer_defaults`` as one ``_global_`` config:
    group choices in its defaults list, values beside them."""
    declared: dict[str, Any] = dict(getattr(recipe_class, "config_defaults", None) or {})
    trainer = getattr(recipe_class, "trainer_defaults", None)
    if trainer:
        if dataclasses.is_dataclass(trainer):
            trainer = dataclasses.asdict(trainer) if not isinstance(trainer, type) else dataclasses.asdict(trainer())
        declared["trainer"] = {**dict(declared.get("trainer") or {}), **dict(trainer)}
    if not declared:
        return None
    choices: list[Any] = []
    values: dict[str, Any] = {}
    for key, value in list(declared.items()):
        if "." in key:  # "scheduler.warmup_steps": 40
            del declared[key]
            *parents, leaf = key.split(".")
            node = values
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
    for group in values:
        if group not in _VALUE_GROUPS:
            raise UserError(
                f"{recipe_class.__qualname__}.config_defaults names an unknown group {group!r}",
                key=group,
                fix=f"Use one of: {', '.join(_VALUE_GROUPS)}.",
            )
    for group, value in declared.items():
        if group not in _VALUE_GROUPS:
            raise UserError(
                f"{recipe_class.__qualname__}.config_defaults names an unknown group {group!r}",
                key=group,
                fix=f"Use one of: {', '.join(_VALUE_GROUPS)}.",
            )
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], Mapping):
            if group not in _CHOICE_GROUPS:
                raise UserError(
                    f"{recipe_class.__qualname__}.config_defaults[{group!r}] picks an option, but {group} has no options",
                    key=group,
                    fix=f"Give {group} a mapping of keys to default values.",
                )
            value = _derived_option(group, value[0], value[1], recipe_class)
        if isinstance(value, str):
            if group not in _CHOICE_GROUPS:
                raise UserError(
                    f"{recipe_class.__qualname__}.config_defaults[{group!r}] is a string, but {group} has no options to pick",
                    key=group,
                    fix=f"Give {group} a mapping of keys to default values.",
                )
            choices.append({f"override /{group}": value})
        elif isinstance(value, Mapping):
            values[group] = _merged(dict(value), values.get(group, {}))
        else:
            raise UserError(
                f"{recipe_class.__qualname__}.config_defaults[{group!r}] must be a mapping or an option name, got {value!r}",
                key=group,
                fix=f'Write config_defaults = {{"{group}": {{"key": value}}}}.',
            )
    return {"defaults": [*choices, "_self_"], **values}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        base[key] = _merged(dict(base.get(key) or {}), value) if isinstance(value, dict) else value
    return base


def _chosen_groups(overrides: Sequence[str]) -> set[str]:
    """Groups whose option the command line picks itself (``model=foo``): left alone."""
    chosen = set()
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if "." not in key and "=" in override:
            chosen.add(key)
    return chosen


# The options this process generated from recipe classes (named after the class): not
# the user's, so listings of "what the user changed" (a sweep's shared overrides, the
# resume command, the options of a group) leave them out.
_generated_options: set[str] = set()


def is_generated_option(name: str) -> bool:
    return name in _generated_options


def is_generated_override(override: str) -> bool:
    key, _, value = override.partition("=")
    return key == DEFAULTS_GROUP or (key in _CHOICE_GROUPS and value in _generated_options)


def recipe_overrides(recipe_class: type, overrides: Sequence[str]) -> list[str]:
    """Register the class's declared config and return the overrides that select it."""
    store = ConfigStore.instance()
    chosen = _chosen_groups(overrides)
    extra: list[str] = []
    for group in ("model", "data"):
        option, node = _group_node(getattr(recipe_class, f"{group}_config", None), group, recipe_class)
        if node is None:
            continue  # config.yaml's choice for a recipe that declares nothing
        store.store(group=group, name=option, node=node)
        _generated_options.add(option)
        if group not in chosen:
            extra.append(f"{group}={option}")
    defaults = _defaults_node(recipe_class)
    if defaults is not None:
        name = option_name(recipe_class)
        store.store(group=DEFAULTS_GROUP, name=name, node=defaults, package="_global_")
        _generated_options.add(name)
        if DEFAULTS_GROUP not in chosen:
            extra.append(f"{DEFAULTS_GROUP}={name}")
    return extra


def selecting_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides that decide which recipe class runs (and where configs are found)."""
    return [o for o in overrides if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] in ("recipe", "hydra")]
