"""Run set d through set a's harness (benchmarks/blind_preflight/run.py), unchanged:

    .venv/bin/python -m benchmarks.blind_preflight_d.run [--only NAME[,NAME]] [--json out.json] [--verbose]

The harness's registry table gets a "d" entry at import time and its per-case subprocess is
pointed at this module, so benchmarks/blind_preflight/run.py needs no edit for this set.
"""

from __future__ import annotations

import os
import subprocess
import sys

import benchmarks.blind_preflight.run as base

base.REGISTRIES.setdefault("d", "benchmarks.blind_preflight_d.registry")
_orig_run = subprocess.run


def _run(cmd, *a, **kw):
    if isinstance(cmd, list) and cmd[1:3] == ["-m", "benchmarks.blind_preflight.run"]:
        cmd = [cmd[0], "-m", "benchmarks.blind_preflight_d.run", *cmd[3:]]
    return _orig_run(cmd, *a, **kw)


base.subprocess.run = _run        # the harness's child command runs this module (so "d" is known there)

if __name__ == "__main__":
    argv = sys.argv[1:]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(base.main(argv if "--set" in argv else ["--set", "d", *argv]))
