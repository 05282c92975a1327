"""Sanity run (no preflight): N plain optimizer steps per case of set be, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_be.sanity [--steps N] [NAME ...]

Set e's loop (benchmarks/blind_preflight_e/sanity.py) with its bf16 autocast on. 300 steps by default; without names,
the healthy cases only, which must show DEC (the mean of the last 3 losses below the first 3).
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight_be.registry import load_all
from benchmarks.blind_preflight_e.sanity import main

if __name__ == "__main__":
    main(sys.argv[1:], load=load_all, steps=300, healthy_only=True, bf16_autocast=True)
