"""Sanity run (no preflight): N plain optimizer steps per case of set f, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_f.sanity [--steps N] [NAME ...]

Set e's loop (benchmarks/blind_preflight_e/sanity.py, which imports nothing from
optimus_preflight) over set f's cases.
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight_e.sanity import main
from benchmarks.blind_preflight_f.registry import load_all

if __name__ == "__main__":
    main(sys.argv[1:], load=load_all)
