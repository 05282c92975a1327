"""The fact each of set bd's broken cases rests on, printed before verify trains it (no preflight involved)."""
from __future__ import annotations

from benchmarks.blind_preflight_bd.registry import FIXES

FACTS = {}


def fact(name):
    def register(fn):
        FACTS[name] = fn
        return fn
    return register


def attach():
    for name, fn in FACTS.items():
        if name in FIXES:
            FIXES[name]["fact"] = fn


attach()
