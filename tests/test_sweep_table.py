"""The sweep table: memory columns that compare like with like, and the overrides a
sweep shares read from the sweep's own parameters (also when it stopped early)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import yaml

from optimus_preflight.reporting.summary import peak_rss_bytes
from optimus_preflight.reporting.sweep_summary import SweepSummaryCallback, job_row, write_sweep_summary
from tests.conftest import REPO, run_cli

GIB = 1024**3


def _write_job(
    sweep_dir: Path,
    job: str,
    overrides: list[str],
    summary: dict | None = None,
    checks: list[dict] | None = None,
) -> Path:
    job_dir = sweep_dir / job
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (job_dir / "summary.json").write_text(json.dumps({"status": "completed", "steps": 30, **summary}))
    if checks is not None:
        (job_dir / "preflight.json").write_text(json.dumps({"status": "passed", "checks": checks}))
    return job_dir


def _write_multirun_yaml(sweep_dir: Path, task: list[str], params: dict | None = None) -> None:
    """What Hydra saves at a sweep's root before its first job starts (trimmed)."""
    hydra_cfg = {"sweeper": {"params": params}, "overrides": {"hydra": ["hydra.mode=MULTIRUN"], "task": task}}
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra_cfg, "trainer": {"max_steps": 30}}))


def _check(name: str, **data) -> dict:
    return {"name": name, "status": "passed", "issues": [], "data": data}


def _csv_rows(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "summary.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _table(sweep_dir: Path) -> tuple[str, list[dict[str, str]]]:
    """summary.md's shared-overrides line and its table rows, by column name."""
    lines = (sweep_dir / "summary.md").read_text().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    header, body = rows[0], rows[2:]
    return lines[0], [dict(zip(header, row)) for row in body]


MEMORY_COLUMNS = ("peak_rss_gib", "measured_tensor_peak_gib", "predicted_tensor_peak_gib", "predicted_for")
HOST_PREDICTION = _check("memory.host_ram", need_bytes=GIB // 10)
NO_GPU = _check("memory.vram_headroom", applicable=False)


@pytest.mark.parametrize(
    ("device", "memory", "checks", "expected"),
    [
        pytest.param(
            "cpu",
            {"device": "cpu", "peak_rss_bytes": 15 * GIB // 10, "peak_tensor_bytes": None},
            [NO_GPU, HOST_PREDICTION],
            ("1.5", "-", "0.1", "cpu"),
            id="cpu: RSS is not a tensor peak",
        ),
        pytest.param(
            "cuda:0",
            {"device": "cuda:0", "peak_rss_bytes": 3 * GIB, "peak_tensor_bytes": 2 * GIB},
            [_check("memory.vram_headroom", need_bytes=19 * GIB // 10), _check("memory.host_ram", applicable=False)],
            ("3", "2", "1.9", "cuda"),
            id="cuda: max_memory_allocated beside the GPU prediction",
        ),
        pytest.param(
            "cpu",
            {"device": "cpu", "peak_rss_bytes": GIB, "peak_tensor_bytes": None},
            [_check("memory.vram_headroom", need_bytes=40 * GIB), HOST_PREDICTION],
            ("1", "-", "40", "cuda"),
            id="cpu job checked for preflight.memory.target_gib",
        ),
    ],
)
def test_memory_columns_say_what_they_measure(tmp_path, device, memory, checks, expected):
    legacy_peak = memory["peak_tensor_bytes"] or memory["peak_rss_bytes"]
    summary = {"peak_memory_bytes": legacy_peak, "memory": memory}
    _write_job(tmp_path, "0", ["optimizer.lr=0.001"], summary, [_check("env.device", device=device), *checks])
    write_sweep_summary(tmp_path)

    _, rows = _table(tmp_path)
    assert tuple(rows[0][column] for column in MEMORY_COLUMNS) == expected and rows[0]["device"] == device
    header = (tmp_path / "summary.md").read_text().splitlines()[2]
    assert "peak_memory_gib" not in header and "predicted_peak_gib" not in header  # the ambiguous pair
    # Scripts written against the earlier summary.csv still find its columns.
    row = _csv_rows(tmp_path)[0]
    assert float(row["peak_memory_gib"]) == pytest.approx(legacy_peak / GIB)
    assert float(row["predicted_peak_gib"]) == float(row["predicted_tensor_peak_gib"]) > 0


@pytest.mark.parametrize(
    ("device", "rss", "tensor"),
    [("cpu", 0.5, None), ("cuda:0", None, 0.5), (None, None, None)],
    ids=["cpu", "cuda", "no preflight"],
)
def test_a_summary_without_memory_is_read_by_the_device_its_preflight_saw(tmp_path, device, rss, tensor):
    checks = None if device is None else [_check("env.device", device=device)]
    job_dir = _write_job(tmp_path, "0", [], {"peak_memory_bytes": GIB // 2}, checks)
    row = job_row(job_dir, "0")
    assert (row["device"], row["peak_rss_gib"], row["measured_tensor_peak_gib"]) == (device, rss, tensor)


@pytest.mark.parametrize(
    ("swept", "params", "job_value"),
    [
        ("optimizer.lr=1e-3,1e-2", None, "optimizer.lr=0.001"),
        ("optimizer.lr=range(1,3)", None, "optimizer.lr=1"),
        ("optimizer.lr=choice(0.1,0.2)", None, "optimizer.lr=0.1"),
        ("+optimizer.lr=interval(0.1,0.2)", None, "+optimizer.lr=0.15"),
        ("model=glob(char_*)", None, "model=char_transformer"),
        (None, {"optimizer.lr": "1e-3,1e-2"}, "optimizer.lr=0.001"),
    ],
    ids=["list", "range", "choice", "interval", "glob", "sweeper.params"],
)
def test_a_swept_parameter_is_never_shared_even_when_one_job_finished(tmp_path, swept, params, job_value):
    """Ctrl+C after the first job: only its directory exists, yet its swept value is its own."""
    _write_multirun_yaml(tmp_path, [o for o in (swept, "trainer.max_steps=30") if o], params)
    _write_job(tmp_path, "0", [job_value, "trainer.max_steps=30"], {"status": "interrupted"})
    write_sweep_summary(tmp_path)

    shared, rows = _table(tmp_path)
    assert shared == "Overrides shared by every job: trainer.max_steps=30"
    assert rows[0]["overrides"] == job_value

    # Without multirun.yaml the finished jobs are all there is to go by.
    (tmp_path / "multirun.yaml").unlink()
    write_sweep_summary(tmp_path)
    both = " ".join(sorted([job_value, "trainer.max_steps=30"]))
    assert _table(tmp_path)[0] == f"Overrides shared by every job: {both}"


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_each_sweep_job_starts_its_own_peak_rss():
    """A sweep's jobs share one process: a big job must not lend its peak to the next."""
    block = bytearray(300 * 1024**2)  # zero-filled, so every page is resident
    held = peak_rss_bytes()
    del block
    SweepSummaryCallback().on_job_start(config=None, task_function=None)
    assert peak_rss_bytes() < held - 200 * 1024**2


@pytest.mark.slow
def test_ctrl_c_mid_sweep_keeps_the_swept_lr_out_of_the_shared_overrides(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        tmp_path / "unused",
        "-m",
        "recipe=char_lm_tiny",
        "logging.progress=none",
        "recipe._target_=tests.signal_recipe.SelfSignalRecipe",
        "trainer.max_steps=12",
        "optimizer.lr=1e-3,1e-2",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=REPO,
        env={"SIGNAL_NAME": "SIGINT", "SIGNAL_PHASE": "train", "SIGNAL_AT": "6"},
    )
    assert result.returncode == 130, result.output
    shared, rows = _table(sweep_dir)
    assert "optimizer.lr" not in shared and "trainer.max_steps=12" in shared
    assert [row["overrides"] for row in rows] == ["optimizer.lr=0.001"] and rows[0]["status"] == "interrupted"
    assert rows[0]["device"] == "cpu" and rows[0]["measured_tensor_peak_gib"] == "-"
    assert float(rows[0]["peak_rss_gib"]) > 0 and float(rows[0]["predicted_tensor_peak_gib"]) > 0
    memory = json.loads((sweep_dir / "0" / "summary.json").read_text())["memory"]
    assert memory["device"] == "cpu" and memory["peak_rss_bytes"] > 0 and memory["peak_tensor_bytes"] is None
