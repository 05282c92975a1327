"""Build objects from `_target_` config nodes, turning config mistakes into UserErrors.

A wrong import path or an argument the target does not take is the user's to fix
(exit 2, key named); an exception raised inside the target's own code is a bug and
keeps its traceback.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from optimus_preflight.errors import UserError


def _import_object(path: str) -> Any:
    """Import ``pkg.module.Name`` (or a nested attribute) from its dotted path."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only a missing *this* module means "try a shorter prefix"; a missing
            # dependency inside an existing module is a real error to report.
            if error.name and module_name.startswith(error.name):
                continue
            raise
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(f"No module named {parts[0]!r}")


def locate(path: str, key: str) -> Any:
    try:
        return _import_object(path)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        raise UserError(
            f"{key}={path!r} cannot be imported ({reason})",
            key=key,
            fix="Give a full import path (module.Name) importable from the working directory.",
        ) from None


def node_target(node: Any, key: str) -> Any:
    if node is None or (isinstance(node, DictConfig) and "_target_" not in node):
        raise UserError(
            f"{key} has no _target_ to build",
            key=key,
            fix=f"Set {key}._target_ to an import path, or override the recipe's builder for {key}.",
        )
    return locate(node._target_, f"{key}._target_")


def check_arguments(target: Any, node: DictConfig, key: str, extra: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # builtins without a signature: let the call itself decide
    arguments = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if not k.startswith("_")}
    try:
        signature.bind(**{**arguments, **extra})
    except TypeError as error:
        raise UserError(
            f"{key} does not match {getattr(target, '__qualname__', target)}{signature}: {error}",
            key=key,
            fix=f"Remove or rename the offending keys under {key} (see `optimus-train --cfg job`).",
        ) from None


def instantiate_node(node: DictConfig, key: str, **extra: Any) -> Any:
    target = node_target(node, key)
    check_arguments(target, node, key, extra)
    try:
        return instantiate(node, **extra, _convert_="all")
    except InstantiationException as error:
        if error.__cause__ is not None:
            raise error.__cause__ from None  # the target's own exception, not Hydra's wrapper
        raise
