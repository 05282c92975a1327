"""Which config keys a recipe's builders read, so an override nobody reads is an error
instead of a silent no-op (a sweep over it would run identical jobs).

While ``recording_reads()`` is active, every value read from a DictConfig is recorded by
its full key. A node read as a whole (iterated, converted with ``to_container``, handed to
``instantiate``) counts as reading everything under it, and so does a node passed on to a
constructor that then iterates it. An interpolation counts as reading what it points to.

Reads can also happen later than the builders (``compute_loss`` reading a key each
step), so a key whose name appears in the recipe's own source code is given the benefit
of the doubt: the check reports only keys that are certainly unused.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from optimus_preflight.errors import UserError

# The groups a recipe's builders consume; the toolkit itself reads trainer, logging,
# preflight, checkpoint and sweep.
BUILDER_OF_GROUP = {
    "model": "build_model",
    "data": "build_dataloaders",
    "optimizer": "build_optimizer",
    "scheduler": "build_scheduler",
}
# Keys of those groups the loop itself reads, whatever the builders do.
TOOLKIT_KEYS = frozenset({"data.fetch_timeout_s"})
_INTERPOLATION = re.compile(r"\$\{([^}:]+)\}")


@dataclass
class ReadLog:
    root: Any = None  # the config whose reads are recorded (other configs have keys too)
    values: set[str] = field(default_factory=set)  # leaves read one by one
    wholes: set[str] = field(default_factory=set)  # nodes read with everything under them

    def covers(self, key: str) -> bool:
        """Read itself, under a node read whole, or (an override of a subtree) in part."""
        if any(whole == "" or key == whole or key.startswith(whole + ".") for whole in self.wholes):
            return True
        return any(value == key or value.startswith(key + ".") for value in self.values)

    def read_under(self, group: str) -> list[str]:
        return sorted(k for k in self.values | self.wholes if k == group or k.startswith(group + "."))


_active: list[ReadLog] = []
_lock = threading.Lock()


def _full_key(node: Any, key: Any = None) -> str:
    try:
        return str(node._get_full_key(key))
    except Exception:
        return ""


def _interpolation_targets(container: DictConfig, key: Any) -> list[str]:
    """Absolute keys an interpolating value points to (``${data.x}``, ``${..x}``)."""
    try:
        node = container._get_node(key)
    except Exception:
        return []
    if node is None or not node._is_interpolation():
        return []
    parent = _full_key(container)
    targets = []
    for reference in _INTERPOLATION.findall(str(node._value())):
        if reference.startswith("."):
            dots = len(reference) - len(reference.lstrip("."))
            base = parent.split(".") if parent else []
            base = base[: max(len(base) - (dots - 1), 0)]
            targets.append(".".join([*base, reference.lstrip(".")]))
        else:
            targets.append(reference.strip())
    return targets


def _record(log_kind: str, node: Any, key: str) -> None:
    try:
        root = node._get_root()
    except Exception:
        return
    for log in _active:
        if root is log.root:
            getattr(log, log_kind).add(key)


@contextlib.contextmanager
def recording_reads(cfg: DictConfig) -> Iterator[ReadLog]:
    """Record the reads of ``cfg`` made inside the block (any thread)."""
    log = ReadLog(root=cfg)
    with _lock:
        _active.append(log)
        if len(_active) == 1:
            _patch()
    try:
        yield log
    finally:
        with _lock:
            _active.remove(log)
            if not _active:
                _unpatch()


_originals: dict[str, Any] = {}


def _patch() -> None:
    get_impl = DictConfig._get_impl

    def recorded_get_impl(self: DictConfig, key: Any, default_value: Any, validate_key: bool = True) -> Any:
        value = get_impl(self, key, default_value, validate_key)
        if _active:
            full = _full_key(self, key)
            _record("wholes" if isinstance(value, ListConfig) else "values", self, full)
            for target in _interpolation_targets(self, key):
                _record("wholes", self, target)
        return value

    def whole(name: str) -> Any:
        original = getattr(DictConfig, name)

        def recorded(self: DictConfig, *args: Any, **kwargs: Any) -> Any:
            if _active:
                _record("wholes", self, _full_key(self))
            return original(self, *args, **kwargs)

        return recorded

    def converted(name: str) -> Any:
        original = getattr(OmegaConf, name)

        def recorded(cfg: Any, *args: Any, **kwargs: Any) -> Any:
            if _active and isinstance(cfg, (DictConfig, ListConfig)):
                _record("wholes", cfg, _full_key(cfg))
            return original(cfg, *args, **kwargs)

        return staticmethod(recorded)

    _originals.update({"_get_impl": get_impl, **{n: getattr(DictConfig, n) for n in ("__iter__", "keys", "items", "items_ex")}})
    _originals.update({f"OmegaConf.{n}": OmegaConf.__dict__[n] for n in ("to_container", "to_object", "to_yaml")})
    DictConfig._get_impl = recorded_get_impl  # type: ignore[method-assign]
    for name in ("__iter__", "keys", "items", "items_ex"):
        setattr(DictConfig, name, whole(name))
    for name in ("to_container", "to_object", "to_yaml"):
        setattr(OmegaConf, name, converted(name))


def _unpatch() -> None:
    for name, original in _originals.items():
        if name.startswith("OmegaConf."):
            setattr(OmegaConf, name.split(".", 1)[1], original)
        else:
            setattr(DictConfig, name, original)
    _originals.clear()


def _source_mentions(recipe_class: type, name: str) -> bool:
    """Whether ``name`` appears in the source of a module that defines the recipe or one
    of its bases outside this toolkit's core (a read the builders did not make yet)."""
    # An access (cfg.model.width, node["width"], getattr(node, "width")), not a field
    # definition (`width: int = 16` in the recipe's own config dataclass).
    pattern = re.compile(rf"\.{re.escape(name)}\b|[\"']{re.escape(name)}[\"']")
    for klass in recipe_class.__mro__:
        module = inspect.getmodule(klass)
        if module is None or module.__name__ == "builtins":
            continue
        if module.__name__.startswith("optimus_preflight.") and not module.__name__.startswith("optimus_preflight.recipes"):
            continue  # the toolkit's own classes read their groups through the builders above
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            return True  # no source to read: assume it is read
        if pattern.search(source):
            return True
    return False


def override_keys(overrides: Sequence[str]) -> list[str]:
    """The value keys of command-line overrides (``model.width=32`` -> ``model.width``);
    group choices (``optimizer=sgd``) and Hydra's own keys are left out."""
    keys = []
    for override in overrides:
        if "=" not in override or override.startswith("~"):
            continue
        key = override.lstrip("+").split("=", 1)[0]
        if "." in key and not key.startswith("hydra."):
            keys.append(key)
    return keys


def check_overrides_read(overrides: Sequence[str], reads: ReadLog, recipe_class: type) -> None:
    """UnreadOverride for the first override of a builder's group that nothing reads."""
    for key in override_keys(overrides):
        group = key.split(".", 1)[0]
        builder = BUILDER_OF_GROUP.get(group)
        if builder is None or key in TOOLKIT_KEYS or reads.covers(key) or _source_mentions(recipe_class, key.rsplit(".", 1)[1]):
            continue
        read = [k for k in reads.read_under(group) if k != group]
        what = f"it reads {', '.join(read[:8])}" if read else f"it reads nothing under cfg.{group}"
        raise UnreadOverride(
            f"{key} is set, but {recipe_class.__qualname__}.{builder} does not read cfg.{key} ({what}), "
            "so the override would change nothing",
            key=key,
            fix=f"Remove the override, or read cfg.{key} in {builder}() (a key the recipe declares in its "
            f"{group}_config dataclass).",
        )


class UnreadOverride(UserError):
    """An override no builder reads: in a sweep every job would be the same run."""
