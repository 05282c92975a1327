"""Sanity run (no preflight): N plain optimizer steps per case of set at, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_at.sanity [--steps N] [NAME ...]

Set e's loop (benchmarks/blind_preflight_e/sanity.py, which imports nothing from optimus_preflight) with its bf16
autocast on. 200 steps by default; without names, the healthy cases only, which must show DEC.
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight_at.registry import load_all
from benchmarks.blind_preflight_e.sanity import main

if __name__ == "__main__":
    main(sys.argv[1:], load=load_all, steps=200, healthy_only=True, bf16_autocast=True)
