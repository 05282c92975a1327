"""Run set bk through set a's harness (benchmarks/blind_preflight/run.py, ``--set bk``):

    .venv/bin/python -m benchmarks.blind_preflight_bk.run [--only NAME[,NAME]] [--json out.json] [--verbose]
"""

from __future__ import annotations

import os
import sys

from benchmarks.blind_preflight.run import main

if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(["--set", "bk", *sys.argv[1:]]))
