"""Sanity run (no preflight): N plain optimizer steps per case of set g, first vs last loss.

    .venv/bin/python -m benchmarks.blind_preflight_g.sanity [--steps N] [NAME ...]

Set e's loop (benchmarks/blind_preflight_e/sanity.py, which imports nothing from optimus_preflight) over set g's
cases: clip_grad_norm, the scheduler stepped after the optimizer, accumulation_steps with loss / k per micro-batch,
and the loss adapter of README's run_preflight contract. Healthy cases must show DEC (the mean of the last 3 losses
below the first 3); broken ones are listed for reference.
"""

from __future__ import annotations

import sys

from benchmarks.blind_preflight_e.sanity import main
from benchmarks.blind_preflight_g.registry import load_all

if __name__ == "__main__":
    main(sys.argv[1:], load=load_all)
