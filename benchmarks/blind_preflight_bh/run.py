"""Run set bh through set a's harness (benchmarks/blind_preflight/run.py, ``--set bh``)."""

from __future__ import annotations

import os
import sys

from benchmarks.blind_preflight.run import main

if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(["--set", "bh", *sys.argv[1:]]))
