"""The fact each broken case rests on, printed by ``verify.py`` (no preflight). Cases without an entry print none."""

from __future__ import annotations

from benchmarks.blind_preflight_be.registry import FIXES, load_all

load_all()
FACTS = {}
for _name, _fn in FACTS.items():
    FIXES[_name]["fact"] = _fn
