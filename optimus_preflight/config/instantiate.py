"""Build objects from `_target_` config nodes, turning config mistakes into UserErrors.

A wrong import path or an argument the target does not take is the user's to fix
(exit 2, key named); an exception raised inside the target's own code is a bug and
keeps its traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import sysconfig
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from optimus_preflight.config.changes import RENAMED_TARGETS
from optimus_preflight.config.invocation import program
from optimus_preflight.errors import UserError


class _ImportFailed(Exception):
    """The module a path names exists, but running its code raised."""

    def __init__(self, module: str, error: BaseException):
        self.module = module
        self.error = error
        super().__init__(module)


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
            raise _ImportFailed(module_name, error) from error
        except Exception as error:  # the module's own code raised (NameError, SyntaxError, ...)
            raise _ImportFailed(module_name, error) from error
        for attribute in parts[split:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(f"No module named {parts[0]!r}")


_NOT_USER_CODE = tuple(Path(p).resolve() for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
_THIS_PACKAGE = Path(__file__).resolve().parents[1]


def _library_file(filename: str) -> bool:
    """Python's, an installed package's or this toolkit's file: not the user's."""
    if filename.startswith("<"):
        return True
    path = Path(filename).resolve()
    return (any(part in ("site-packages", "dist-packages") for part in path.parts) or path.is_relative_to(_THIS_PACKAGE)
            or any(path.is_relative_to(root) for root in _NOT_USER_CODE))


def _user_frames(error: BaseException) -> list[tuple[str, int | None, str, str | None]]:
    """(file, line, function, source) of the user's own files that led to ``error``,
    innermost last: importlib's and the libraries' frames say nothing about what to fix.
    A SyntaxError's own location comes last: no frame runs the line that cannot parse."""
    every = [(f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(error.__traceback__)]
    frames = [frame for frame in every if not _library_file(frame[0])]
    if isinstance(error, SyntaxError) and error.filename:
        frames.append((error.filename, error.lineno, "<module>", (error.text or "").strip() or None))
    # An installed package of the user's has no "user" frame: then the innermost one.
    return frames or every[-1:]


def import_failure(path: str, key: str, module: str, error: BaseException, limit: int = 6) -> UserError:
    """The error raised by the code of the module a path names, with its file and line."""
    frames = _user_frames(error)
    detail = error.msg if isinstance(error, SyntaxError) else str(error)
    at = f" at {frames[-1][0]}:{frames[-1][1]}" if frames else ""
    trace = "".join(f'\n  File "{file}", line {line}, in {name}' + (f"\n    {source}" if source else "") for file, line, name, source in frames[-limit:])
    missing = f" (or install {error.name})" if isinstance(error, ModuleNotFoundError) and error.name else ""
    return UserError(
        f"{key}={path!r}: importing {module} raised {type(error).__name__}: {detail}{at}",
        key=key,
        fix=f"Fix that line{missing}; the import path itself is fine." + (f" Where it happened:{trace}" if trace else ""),
    )


def locate(path: str, key: str) -> Any:
    path = RENAMED_TARGETS.get(path, path)  # a config saved by an earlier release
    try:
        return _import_object(path)
    except _ImportFailed as failed:
        raise import_failure(path, key, failed.module, failed.error) from None
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
            fix=f"Remove or rename the offending keys under {key} (see `{program()} --cfg job`).",
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


# How builders reject a value they alone can judge: nn.Dropout's and the optimizers'
# range checks raise ValueError, nanoGPT-style models `assert d_model % n_head == 0`,
# and a head count of 0 divides by zero.
REJECTIONS = (ValueError, AssertionError, ZeroDivisionError)


_REFERENCE = re.compile(r"^\$\{(\.*)([A-Za-z0-9_.]+)\}$")


def _source_key(node: DictConfig, key: str, path: str) -> str | None:
    """The key an interpolated value copies (``${data.train.block_size}``, or relative
    ``${..train.block_size}``): where the user sets it. None for anything else."""
    match = _REFERENCE.match(str(node._get_node(key)._value()))
    if not match:
        return None
    dots, target = match.groups()
    if not dots:
        return target
    base = path.split(".")[:-1]  # the node holding this value
    base = base[: len(base) - (len(dots) - 1)] if len(dots) > 1 else base
    return ".".join([*base, target])


def _leaf_keys(node: Any, prefix: str) -> list[tuple[str, str]]:
    """(name as the builder sees it, dotted key the user sets) for a node's values."""
    if not isinstance(node, DictConfig):
        return []
    keys: list[tuple[str, str]] = []
    for key in node:
        path = f"{prefix}.{key}"
        if str(key).startswith("_"):
            continue
        if OmegaConf.is_interpolation(node, key):
            source = _source_key(node, key, path)
            if source:
                keys.append((str(key), source))
            continue
        child = node._get_node(key)._value() if not OmegaConf.is_missing(node, key) else None
        keys.extend(_leaf_keys(child, path) if isinstance(child, DictConfig) else [(str(key), path)])
    return keys


def _mentions(text: str, name: str) -> int | None:
    """Where the message names a config key: ``n_head``, or ``beta`` for ``betas``."""
    candidates = {name, name.rstrip("s")} if len(name) > 3 else {name}
    found = [match.start() for word in candidates for match in re.finditer(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", text)]
    return min(found) if found else None


def rejection_error(group: str, node: Any, error: BaseException) -> UserError:
    """A UserError naming the keys of ``group`` that the builder's message names."""
    frames = traceback.extract_tb(error.__traceback__)
    where = frames[-1] if frames else None
    text = str(error).strip() or (where.line if where and where.line else type(error).__name__)
    positions: dict[str, int] = {}
    for name, key in _leaf_keys(node, group):
        at = _mentions(text, name)
        if at is not None:
            positions[key] = min(at, positions.get(key, at))
    keys = sorted(positions, key=positions.get)
    location = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    named = " or ".join(keys)
    return UserError(
        f"the {group} builder rejected {', '.join(keys) or f'the {group} config'}: {text} "
        f"({type(error).__name__}{location})",
        key=keys[0] if keys else group,
        fix=(f"Change {named} (`{program()} --cfg job` prints the composed values)." if keys
             else f"Check the values under {group} (`{program()} --cfg job` prints them)."),
    )


@contextlib.contextmanager
def config_rejections(group: str, node: Any) -> Iterator[None]:
    """Within the block, a builder's rejection of its config is a UserError (exit 2,
    the key named) instead of a traceback."""
    try:
        yield
    except REJECTIONS as error:
        raise rejection_error(group, node, error) from None
