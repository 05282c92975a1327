"""JSON that every reader can parse: no bare NaN or Infinity.

Python's json writes float('nan') as ``NaN``, which is not JSON (jq, JavaScript and
strict parsers reject the whole file). A non-finite number is written as null, and
the record says which values were non-finite, and how, under ``"nonfinite"``.
"""

from __future__ import annotations

import json
import math
from typing import Any

NONFINITE_KEY = "nonfinite"


def _describe(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _clean(value: Any, path: str, found: dict[str, str]) -> Any:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        found[path] = _describe(value)
        return None
    if isinstance(value, dict):
        return {key: _clean(item, f"{path}.{key}" if path else str(key), found) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(item, f"{path}[{index}]", found) for index, item in enumerate(value)]
    return value


def json_ready(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with non-finite floats (at any depth) replaced by None, plus
    ``nonfinite: {"loss": "nan", "data.peak[2]": "inf"}`` when there were any."""
    found: dict[str, str] = {}
    cleaned = _clean(record, "", found)
    if found:
        cleaned[NONFINITE_KEY] = {**cleaned.get(NONFINITE_KEY, {}), **found}
    return cleaned


def dumps(record: dict[str, Any], **options: Any) -> str:
    """json.dumps of ``json_ready(record)``; raises rather than write invalid JSON."""
    return json.dumps(json_ready(record), allow_nan=False, default=str, **options)


def value_of(record: dict[str, Any], key: str) -> float | None:
    """A number from a record written by ``dumps``: a non-finite one comes back as
    float('nan'/'inf') from its ``nonfinite`` entry (older files wrote it as text)."""
    value = record.get(key)
    if value is None:
        value = (record.get(NONFINITE_KEY) or {}).get(key)
    return to_float(value)


def to_float(value: Any) -> float | None:
    """A number, or the text of one ("nan", "inf"); None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
