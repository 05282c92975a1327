"""benchmarks/gpu_validation.py: the whole script in its tiny mode on this CPU machine (every GPU
part reported as skipped with a reason, the CPU parts with values), and the pure parts that
judge the GPU runs and set up a GPU machine, on synthetic inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu_checks import bootstrap
from benchmarks.gpu_checks.context import Completed
from benchmarks.gpu_checks.report import SECTION_TITLES, Report, Section, markdown
from benchmarks.gpu_checks.runs import analyze_scaler, pick_batches, real_outcome, throughput, vram_verdict
from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_validation.py"
GPU_ONLY = ("oom_observer", "fp16_grad_scaler", "vram_headroom", "throughput", "fsdp")


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only behaviour")
    root = tmp_path_factory.mktemp("gpu_validation")
    out = root / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--tiny", "--no-setup", "--work-dir", str(root / "work"),
             # Generous: on a busy 2-core machine a section may take many times its GPU budget.
             "--budget-s", "3600"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stdout[:5000] + done.stderr[-3000:]
    report = json.loads((out / "gpu_validation.json").read_text())
    return report, (out / "gpu_validation.md").read_text(), {s["name"]: s for s in report["sections"]}


@pytest.mark.slow
def test_on_the_cpu_every_gpu_part_is_skipped_with_the_reason(cpu_report):
    report, table, sections = cpu_report
    assert report["complete"] and report["mode"] == "tiny" and report["schema"] == 1
    assert list(sections) == list(SECTION_TITLES)
    assert report["environment"]["torch"] == torch.__version__ and not report["environment"]["cuda_available"]
    for name in GPU_ONLY + ("memory", "check_model_gpu_memory"):
        assert sections[name]["status"] == "skipped", sections[name]
        assert sections[name]["reason"].startswith("no CUDA: torch "), sections[name]["reason"]
    # The features that may not exist yet say so when they are missing.
    compile_ok = sections["throughput"]["data"]["compile_supported"]
    assert compile_ok or "trainer.compile does not exist" in sections["throughput"]["reason"]
    assert isinstance(sections["fsdp"]["data"].get("fsdp_supported", False), bool)
    # One table: a row per section, then a detail table per section.
    for name in SECTION_TITLES:
        assert f"| {name} | {sections[name]['status']} |" in table
        assert f"## {name}: " in table


@pytest.mark.slow
def test_on_the_cpu_the_cpu_parts_run_and_report_values(cpu_report):
    _, table, sections = cpu_report
    memory = sections["memory"]
    assert {r["model"] for r in memory["rows"]} == {"mlp", "cnn_bn", "char_lm", "gpt2", "llama", "gpt2_ckpt"}
    assert {r["precision"] for r in memory["rows"]} == {"fp32", "bf16", "fp16"}
    assert {r["optimizer_step"] for r in memory["rows"]} >= {"foreach", "fused"}
    for row in memory["rows"]:
        assert row["status"] == "skipped" and row["method"] == "fake", row
        # Traced for a CUDA target: allocator rounding and the workspace allowance are in.
        assert row["predicted_alloc_bytes"] > row["predicted_tensor_peak_bytes"] > 0
        assert row["predicted_reserved_bytes"] >= row["predicted_alloc_bytes"]
        assert row.get("measured_alloc_bytes") is None
    assert all(m["parameters"] > 0 for m in memory["data"]["models"].values())
    assert "| mlp | fp32 | adamw_foreach | foreach | fake |" in table

    ddp = {r["backend"]: r for r in sections["ddp"]["rows"]}
    assert sections["ddp"]["status"] == "partial"
    assert ddp["gloo"]["status"] == "passed" and ddp["gloo"]["world_size"] == 2
    assert ddp["gloo"]["max_weight_diff"] <= 1e-5 and ddp["gloo"]["allreduce_calls"] == 3  # one per step: no_sync held
    assert ddp["nccl"]["status"] == "skipped" and "no CUDA" in ddp["nccl"]["reason"]

    [check] = sections["check_model_gpu_memory"]["rows"]
    assert "no CUDA device: predicted CPU-side peak" in check["logged"]
    assert check["predicted_alloc_bytes"] > 0 and check["state_restored"] is True


def _records(scales, skipped, lrs, warnings=()):
    records = [{"step": i + 1, "loss": 4.0e8, "grad_scale": s, "skipped_steps": k, "lr": lr}
               for i, (s, k, lr) in enumerate(zip(scales, skipped, lrs))]
    for step, code in warnings:
        records[step - 1].setdefault("warnings", []).append({"code": code})
    return records + [{"step": len(records), "val_loss": 4.0}]


def test_the_scaler_claims_hold_for_an_overflowing_run_and_fail_when_the_scheduler_moves():
    scales = [1024 / 2**k for k in range(1, 13)]
    good = _records(scales, list(range(1, 13)), [6e-4] * 12, [(3, "O24_SKIPS"), (9, "O24")])
    assert {c["claim"]: c["status"] for c in analyze_scaler(good, True)} == {
        "every step skipped and counted": "passed", "grad_scale halves on each overflow": "passed",
        "scheduler held (LR unchanged while skipping)": "passed", "skip-rate warning (O24_SKIPS)": "passed",
        "collapsed-scale warning (O24)": "passed"}
    moving = _records(scales, list(range(1, 13)), [1e-4 * k for k in range(1, 13)], [(3, "O24_SKIPS")])
    failed = {c["claim"] for c in analyze_scaler(moving, True) if c["status"] == "failed"}
    assert failed == {"scheduler held (LR unchanged while skipping)", "collapsed-scale warning (O24)"}
    healthy = _records([1024.0] * 5, [0] * 5, [6e-4] * 5)
    assert all(c["status"] == "passed" for c in analyze_scaler(healthy, False))
    assert analyze_scaler([], True)[0]["status"] == "failed"


def test_the_vram_verdict_outcome_and_batch_sizes():
    preflight = {"checks": [{"name": "memory.vram_headroom", "status": "error", "issues": [{"code": "MEM1"}],
                             "data": {"need_bytes": 9 << 30, "limit_bytes": 7 << 30, "largest_micro_batch": 40}}]}
    assert vram_verdict(preflight) == {"verdict": "will not fit", "check_status": "error", "codes": ["MEM1"],
                                       "need_bytes": 9 << 30, "limit_bytes": 7 << 30, "largest_micro_batch": 40}
    warned = {"checks": [{"name": "memory.vram_headroom", "status": "warning", "issues": [{"code": "MEM2"}], "data": {}}]}
    assert vram_verdict(warned)["verdict"] == "fits" and vram_verdict(None)["verdict"] == "missing"
    # need(n) = 1 GiB + n * 64 MiB; limit 7 GiB; the card offers 7.5 GiB.
    gib, mib = 1 << 30, 1 << 20
    fit, over = pick_batches(gib + 8 * 64 * mib, 8, gib + 16 * 64 * mib, 16, 7 * gib, int(7.5 * gib))
    assert gib + fit * 64 * mib <= 0.95 * 7 * gib < gib + (fit + 1) * 64 * mib
    assert gib + over * 64 * mib >= 1.08 * 7.5 * gib > gib + (over - 1) * 64 * mib
    with pytest.raises(ValueError):
        pick_batches(gib, 8, gib, 16, 7 * gib, 7 * gib)
    assert real_outcome(Completed(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", 1.0)) == "oom"
    assert real_outcome(Completed(None, "", 120.0)) == "timeout"
    assert real_outcome(Completed(1, "ValueError", 1.0)) == "failed"


def test_throughput_skips_the_first_window():
    records = [{"step": 20, "loss": 3.0, "samples_per_s": 10.0}] + [
        {"step": 20 * k, "loss": 2.0, "samples_per_s": v} for k, v in ((2, 100.0), (3, 90.0), (4, 110.0))]
    figures = throughput(records, 128)
    assert figures["samples_per_s"] == 100.0 and figures["tokens_per_s"] == 12800
    assert figures["first_window_samples_per_s"] == 10.0 and throughput(records[:1], 128)["samples_per_s"] is None


def test_the_report_derives_statuses_and_writes_both_files(tmp_path):
    partial = Section("ddp", "t")
    partial.add("passed", None, backend="gloo")
    partial.add("skipped", "no CUDA: NCCL needs a GPU", backend="nccl")
    partial.finish()
    assert (partial.status, partial.reason) == ("partial", "no CUDA: NCCL needs a GPU")
    failed = Section("memory", "t", columns=["model", "alloc_error_pct", "predicted_alloc_bytes"])
    failed.add("passed", None, model="mlp", alloc_error_pct=2.5, predicted_alloc_bytes=3 << 30)
    failed.add("failed", None, model="llama", alloc_error_pct=-14.0, predicted_alloc_bytes=float("nan"))
    failed.finish()
    assert failed.status == "failed"
    empty = Section("oom_observer", "t")
    empty.finish()
    assert empty.status == "error"
    report = Report(tmp_path, "full", 390.0, {"torch": "x"}, [partial, failed, empty])
    json_path, md_path = report.write()
    payload = json.loads(json_path.read_text())
    assert payload["sections"][1]["rows"][1]["predicted_alloc_bytes"] == "nan" and not payload["complete"]
    text = md_path.read_text()
    assert "| mlp | +2.5% | 3.00 GiB |" in text and "| ddp | partial |" in text
    assert markdown(payload) == text


def test_the_set_up_picks_a_cuda_torch_and_installs_only_what_is_missing(tmp_path):
    assert bootstrap.torch_build("2.13.0+cpu", None) == "cpu"
    assert bootstrap.torch_build("2.11.0+cu130", "13.0") == "cuda"
    assert bootstrap.torch_build("2.5.0+rocm6.2", None) == "rocm" and bootstrap.torch_build(None, None) == "none"
    cpu = bootstrap.Interpreter("/repo/.venv/bin/python", {"torch": "2.13.0+cpu", "torch_cuda": None})
    hidden = bootstrap.Interpreter("/usr/bin/python3", {"torch": "2.11.0+cu130", "torch_cuda": "13.0",
                                                        "cuda_available": False})
    gpu = bootstrap.Interpreter("/opt/torch/.venv/bin/python3", {"torch": "2.11.0+cu130", "torch_cuda": "13.0",
                                                                 "cuda_available": True})
    assert bootstrap.choose([cpu, hidden, gpu]) is gpu and bootstrap.choose([cpu, hidden]) is hidden
    assert bootstrap.choose([cpu]) is cpu and bootstrap.choose([bootstrap.Interpreter("x", {})]) is None
    assert bootstrap.missing_distributions(["hydra", "omegaconf", "psutil"]) == [
        "hydra-core", "omegaconf", "antlr4-python3-runtime", "psutil"]
    for name in ("hydra_core-1.3.8-py3-none-any.whl", "antlr4_python3_runtime-4.9.3-py3-none-any.whl",
                 "antlr4-python3-runtime-4.9.3.tar.gz", "notes.txt"):
        (tmp_path / name).write_text("")
    found = bootstrap.distributions_in(tmp_path)
    assert set(found) == {"hydra-core", "antlr4-python3-runtime"} and found["antlr4-python3-runtime"].suffix == ".whl"
    from benchmarks.gpu_validation import child_argv

    argv = ["--out", "o", "--wheels", "w", "--python=p", "--tiny", "--install-torch", "--budget-s", "9", "--sections=ddp"]
    assert child_argv(argv, 300.4, tmp_path / "o", tmp_path / "w") == [
        "--tiny", "--sections=ddp", "--out", str(tmp_path / "o"), "--work-dir", str(tmp_path / "w"), "--no-setup",
        "--budget-s", "300"]


def test_fetched_wheels_are_the_known_good_set_whatever_this_interpreter_holds(tmp_path, monkeypatch):
    # The GPU machine failed its set-up when --fetch-wheels copied this interpreter's antlr4
    # 4.13: omegaconf 2.3's grammar loads only with the 4.9 runtime.
    commands = []
    monkeypatch.setattr(bootstrap.subprocess, "run", lambda command, **_: commands.append(command) or subprocess.CompletedProcess(command, 0))
    monkeypatch.setattr(bootstrap, "wheel_files", lambda folder: [])
    assert bootstrap.fetch_wheels(tmp_path) == 0
    pinned = {part for command in commands for part in command if "==" in part}
    assert pinned == {f"{name}=={version}" for name, version in bootstrap.DEFAULT_VERSIONS.items()}
    assert "antlr4-python3-runtime==4.9.3" in pinned
