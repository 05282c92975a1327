"""A full disk or an unwritable checkpoints/ mid-run: one clear message (exit 2, no
traceback), the last good checkpoint kept, metrics.jsonl flushed, summary.json written
where space allows. The disk is a small tmpfs mounted in a private mount namespace
(`unshare -m`, root only); the test is skipped where that is not allowed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optimus_preflight.checkpoint.store import verify
from tests.conftest import REPO

BASE = ("recipe=char_lm_tiny", "logging.progress=none", "logging.flush_every_s=0", "trainer.max_steps=40",
        "checkpoint.every_n_steps=5", "checkpoint.keep_last=1",
        # The preflight would refuse the small disk up front; here the disk fails mid-run.
        "preflight.disable=[env.disk_space]")

# Mounts a tmpfs of SIZE on the run dir, runs the CLI, copies what it left to OUT.
SCRIPT = textwrap.dedent("""
    set -u
    run=$1; out=$2; size=$3; shift 3
    mkdir -p "$run" "$out/run"
    mount -t tmpfs -o size="$size" tmpfs "$run" || exit 97
    "$@" > "$out/stdout" 2> "$out/stderr"
    echo $? > "$out/rc"
    cp -a "$run/." "$out/run/"
""")


def _can_mount() -> bool:
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _can_mount(), reason="needs root to mount a small tmpfs in a private mount namespace"),
]


def run_on_small_disk(tmp_path: Path, size: str, *overrides: str, env: dict | None = None):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "optimus_preflight.cli", f"hydra.run.dir={tmp_path / 'mnt'}", *BASE, *overrides]
    subprocess.run(["unshare", "-m", "bash", "-c", SCRIPT, "diskfull", str(tmp_path / "mnt"), str(out), size, *command],
                   cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, timeout=300, check=False)
    rc = int((out / "rc").read_text())
    return rc, (out / "stdout").read_text() + (out / "stderr").read_text(), out / "run"


def _assert_one_clear_stop(rc: int, output: str, run_dir: Path) -> dict:
    assert rc == 2, output
    assert "Traceback" not in output and "--- Logging error ---" not in output
    assert "No space left on device" in output and "checkpoint.resume=auto" in output
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records, "metrics.jsonl was flushed"
    return {"records": records, "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))}


def test_a_checkpoint_that_no_longer_fits_stops_the_run_with_one_message(tmp_path):
    # The first checkpoint (~0.66 MB: DCP's files) fits; the next one cannot be written beside it.
    rc, output, run_dir = run_on_small_disk(tmp_path, "1000k")
    found = _assert_one_clear_stop(rc, output, run_dir)
    assert found["checkpoints"] == ["step_00000005"]
    verify(run_dir / "checkpoints" / "step_00000005")  # the last good one is intact
    assert "The last good checkpoint is" in output and "step_00000005" in output
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))  # the partial write is gone
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert max(r["step"] for r in found["records"]) == 10


def test_a_disk_that_fills_up_mid_run_stops_it_cleanly(tmp_path):
    """Another job fills the disk at step 7: metrics, the next checkpoint and the
    summary all hit a full disk; still one message, and the last checkpoint survives."""
    rc, output, run_dir = run_on_small_disk(
        tmp_path, "2m", "recipe._target_=tests.storage_recipe.DiskFillingRecipe", env={"FILL_AT_STEP": "7"}
    )
    found = _assert_one_clear_stop(rc, output, run_dir)
    assert found["checkpoints"] == ["step_00000005"]
    verify(run_dir / "checkpoints" / "step_00000005")
    assert not list(run_dir.glob(".*.tmp"))  # no half-written summary beside the real one


@pytest.mark.slow
def test_an_unwritable_checkpoints_dir_fails_the_preflight(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").write_text("not a directory")  # e.g. a stale file where the dir should be
    from tests.conftest import run_cli

    result = run_cli(run_dir, "recipe=char_lm_tiny", "logging.progress=none", "preflight.only=true", cwd=REPO)
    assert result.returncode == 3, result.output
    assert "ENV_RUN_DIR" in result.output and "checkpoints" in result.output


def test_a_short_zip_write_on_a_refusing_disk_is_that_disk_error(tmp_path, monkeypatch):
    # DCP's records are torch.save zips: on a full disk the writer says "unexpected pos ..."
    # (a RuntimeError); the store only turns OSErrors into the one clear message.
    import errno

    import torch

    from optimus_preflight.checkpoint import dcp_io

    def short_write(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(dcp_io.dcp, "save", short_write)
    monkeypatch.setattr(dcp_io, "storage_refusal", lambda directory: OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError) as refused:
        dcp_io.save_tensors(tmp_path, {"w": torch.zeros(2)})
    assert refused.value.errno == errno.ENOSPC
    monkeypatch.setattr(dcp_io, "storage_refusal", lambda directory: None)  # the disk takes writes: a real bug
    with pytest.raises(RuntimeError, match="unexpected pos"):
        dcp_io.save_tensors(tmp_path, {"w": torch.zeros(2)})


def test_the_space_probe_leaves_nothing_behind(tmp_path):
    from optimus_preflight.checkpoint.dcp_io import storage_refusal

    assert storage_refusal(tmp_path) is None and not list(tmp_path.iterdir())
    assert isinstance(storage_refusal(tmp_path / "missing"), OSError)
