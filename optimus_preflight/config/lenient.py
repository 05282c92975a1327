"""Best-effort reads of a config of any shape: None for "absent or unusable", never an exception.

Functions that take "the full training config" must work on whatever a caller hands them:
a plain dict (YAML loaded with ``yaml.safe_load``), an OmegaConf DictConfig, our composed
config, an attribute object, ``{}``. A value of the wrong type is coerced where the intent
is plain (``"16"``, ``16.0``) and unusable otherwise.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def conf_get(conf: Any, dotted: str) -> Any:
    """The value at ``dotted`` in a dict, DictConfig or attribute object; None when it
    is absent, MISSING (``???``), an interpolation that does not resolve, or when
    anything on the way is not a container."""
    node = conf
    for part in dotted.split("."):
        if node is None:
            return None
        try:
            if isinstance(node, DictConfig):
                node = OmegaConf.select(node, part, default=None, throw_on_missing=False)
            elif isinstance(node, Mapping):
                node = node.get(part)
            elif isinstance(node, (str, bytes, int, float, list, tuple, ListConfig)):
                return None
            else:
                node = getattr(node, part, None)
        except Exception:  # a broken interpolation, a property that raises: absent, for a best-effort reader
            return None
    return node


def as_int(value: Any, minimum: int = 0) -> int | None:
    """``value`` as an int >= ``minimum``: ints, integral floats and numeric strings;
    None for anything else (booleans included: ``True`` workers is a typo, not 1)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):  # numpy ints too
        value = int(value)
    elif isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, numbers.Real) and not isinstance(value, int):
        if not math.isfinite(value) or not float(value).is_integer():
            return None
        value = int(value)
    if isinstance(value, int) and value >= minimum:
        return value
    return None


def as_float(value: Any) -> float | None:
    """``value`` as a float (numbers, numeric strings, one-element tensors); None otherwise."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    return None
